"""Post-hoc calibration and metrics of one trained cell: logits in, result rows out.

Every calibrator is fitted on the cell's validation logits and applied to the
clean test logits and to every shifted test set. All evaluation sets of one
size are stacked and every metric is computed for all of them in one jitted,
vmapped call.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from calib_jax import metrics, posthoc, storage
from calib_jax.benchmark import conformal_sets

# Row keys of the metrics, with the convention of each (report headers name it).
METRICS: dict[str, str] = {
    "accuracy": "top-1 accuracy",
    "ece_l2_em": "ECE, 15 equal-mass bins, l2 (soft-calibration paper)",
    "ece": "ECE, 15 equal-width bins, l1 (Guo et al.; focal/ACLS papers)",
    "adaptive_ece": "adaptive ECE, 15 equal-mass bins, l1",
    "classwise_ece": "classwise ECE, 15 equal-width bins, l1",
    "ks_error": "KS error (Gupta et al. 2021)",
    "brier": "Brier score",
    "nll": "negative log-likelihood",
    "aurc": "AURC (maximum softmax probability)",
}


def _all_metrics(probs: jax.Array, labels: jax.Array, num_bins: int) -> dict:
    """Every metric of :data:`METRICS` for one evaluation set (jittable core)."""
    return {
        "accuracy": metrics.accuracy(probs, labels),
        "ece_l2_em": metrics.ece(
            probs, labels, num_bins=num_bins, binning="equal_mass", p=2
        ),
        "ece": metrics.ece(probs, labels, num_bins=num_bins),
        "adaptive_ece": metrics.adaptive_ece(probs, labels, num_bins=num_bins),
        "classwise_ece": metrics.classwise_ece(probs, labels, num_bins=num_bins),
        "ks_error": metrics.ks_error(probs, labels),
        "brier": metrics.brier(probs, labels),
        "nll": metrics.nll(probs, labels),
        "aurc": metrics.aurc(probs, labels),
    }


@functools.partial(jax.jit, static_argnames="num_bins")
def stacked_metrics(logits: jax.Array, labels: jax.Array, *, num_bins: int = 15):
    """Metrics of ``S`` evaluation sets of one size.

    Args:
      logits: float ``[S, N, K]`` (calibrated) logits.
      labels: int ``[S, N]`` labels.
      num_bins: static number of bins of the binned metrics.

    Returns:
      ``{metric: float32 [S]}`` for every key of :data:`METRICS`.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jax.vmap(lambda p, y: _all_metrics(p, y, num_bins))(probs, labels)


def load_logits(train_dir: epath.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (logits, labels)}`` exported by the trainer.

    Split names: ``val``, ``test`` and ``<corruption>/<severity>`` for every
    shifted test set.
    """
    out = {}
    for path in sorted((storage.as_path(train_dir) / "logits").glob("*.npz")):
        name = path.stem
        if name.startswith("shift_"):
            corruption, _, severity = name[len("shift_") :].rpartition("_")
            name = f"{corruption}/{severity}"
        f = storage.load_npz(path)
        out[name] = (np.asarray(f["logits"], np.float32), np.asarray(f["labels"]))
    if "val" not in out or "test" not in out:
        raise ValueError(
            f"{train_dir}/logits lacks val.npz or test.npz; the run did not finish."
        )
    return out


def _fit(name: str, logits, labels):
    """``(apply, summary)`` of calibrator ``name`` fitted on validation logits."""
    if name == "none":
        return (lambda z: z), {}
    cal = posthoc.fit(name, logits, labels)
    summary = {
        k: float(v)
        for k, v in cal.summary().items()
        if isinstance(v, (int, float, np.floating)) and np.isfinite(v)
    }
    return cal.apply, summary


def cell_rows(
    logits: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    method: str,
    seed: int,
    calibrators,
    num_bins: int = 15,
) -> list[dict]:
    """Result rows of one trained cell: one per calibrator x evaluation set.

    Args:
      logits: ``{split: (logits, labels)}`` from :func:`load_logits`.
      method: the training method's name.
      seed: the training seed.
      calibrators: names (``'none'`` or registry names).
      num_bins: bins of the binned metrics.

    Returns:
      Rows ``{method, calibrator, seed, shift, corruption, severity, **metrics}``
      (with the conformal-set fields of :mod:`conformal_sets`)
      with ``shift='clean'`` (severity 0) for the test set and
      ``'<corruption>/<severity>'`` for shifted sets; the validation set is
      only fitted on, never scored.
    """
    val_z, val_y = logits["val"]
    splits = [s for s in logits if s != "val"]
    splits.sort(key=lambda s: (s != "test", s))
    groups: dict[tuple, list[str]] = {}
    for s in splits:
        groups.setdefault(logits[s][0].shape, []).append(s)
    rows = []
    for cal_name in calibrators:
        apply, params = _fit(cal_name, val_z, val_y)
        predictors = conformal_sets.fit(apply(val_z), val_y)
        values: dict[str, dict[str, float]] = {}
        for shape, names in groups.items():
            z = np.stack([logits[s][0] for s in names])
            y = np.stack([logits[s][1] for s in names])
            z = np.asarray(apply(z.reshape(-1, shape[-1]))).reshape(z.shape)
            out = jax.device_get(stacked_metrics(z, y, num_bins=num_bins))
            out.update(conformal_sets.scores(predictors, z, y))
            for i, s in enumerate(names):
                values[s] = {k: float(v[i]) for k, v in out.items()}
        for s in splits:
            corruption, severity = ("clean", 0)
            if s != "test":
                corruption, sev = s.split("/")
                severity = int(sev)
            rows.append(
                dict(
                    method=method,
                    calibrator=cal_name,
                    seed=int(seed),
                    shift="clean" if s == "test" else s,
                    corruption=corruption,
                    severity=severity,
                    **values[s],
                    **({"fit": params} if s == "test" and params else {}),
                )
            )
    return rows
