"""Post-hoc calibration and metrics of one trained cell: logits in, result rows out.

Every calibrator is fitted on the cell's validation logits and applied to the
clean test logits, to every shifted test set and to the OOD set. All
evaluation sets of one size are stacked and every metric is computed for all
of them in one jitted, vmapped call. The clean row of each calibrator also
carries OOD detection scores (:data:`OOD_FIELDS`) and bootstrap percentile
intervals of :data:`BOOTSTRAP_METRICS` (``<metric>_lo``, ``<metric>_hi``).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from calib_jax import metrics, posthoc, storage
from calib_jax.benchmark import conformal_sets
from calib_jax.train import evaluate as train_eval

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


# Row keys of the OOD scores (test split positive, maximum softmax probability).
OOD_FIELDS: dict[str, str] = {
    "ood_auroc": "AUROC",
    "ood_aupr_in": "AUPR-In",
    "ood_aupr_out": "AUPR-Out",
    "ood_fpr_at_95_tpr": "FPR at 95% TPR",
}
# Metrics of the report's main tables with per-cell bootstrap intervals.
BOOTSTRAP_METRICS = ("accuracy", "ece_l2_em", "ece", "nll")
_BOOTSTRAP_SEED = 20_000


def bootstrap_key(method: str, seed: int) -> jax.Array:
    """The fixed resampling key of a cell (every calibrator shares its resamples)."""
    key = jax.random.key(_BOOTSTRAP_SEED)
    key = jax.random.fold_in(key, zlib.crc32(method.encode()) & 0x7FFFFFFF)
    return jax.random.fold_in(key, seed)


@functools.cache
def _bootstrap_metrics(num_bins: int) -> dict:
    """``{name: metric}`` of :data:`BOOTSTRAP_METRICS`, as in :data:`METRICS`.

    Cached, so that every call passes the same functions (one compile).
    """
    return {
        "accuracy": metrics.accuracy,
        "ece_l2_em": functools.partial(
            metrics.ece, num_bins=num_bins, binning="equal_mass", p=2
        ),
        "ece": functools.partial(metrics.ece, num_bins=num_bins),
        "nll": metrics.nll,
    }


def bootstrap_fields(
    logits, labels, *, key, num_samples: int, confidence: float, num_bins: int = 15
) -> dict[str, float]:
    """``{<metric>_lo, <metric>_hi}`` of :data:`BOOTSTRAP_METRICS` on one set.

    Percentile intervals of :func:`calib_jax.metrics.bootstrap`, every metric
    on the same ``num_samples`` resamples drawn with ``key``.
    """
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    res = metrics.bootstrap(
        _bootstrap_metrics(num_bins),
        probs,
        jnp.asarray(labels),
        num_samples=num_samples,
        key=key,
        confidence=confidence,
    )
    lower, upper = jax.device_get((res.lower, res.upper))
    out = {}
    for name in BOOTSTRAP_METRICS:
        out[f"{name}_lo"] = float(lower[name])
        out[f"{name}_hi"] = float(upper[name])
    return out


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


def load_logits(
    train_dir: epath.PathLike, ood_name: str = ""
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (logits, labels)}`` exported by the trainer.

    Split names: ``val``, ``test``, ``<corruption>/<severity>`` for every
    shifted test set, and ``ood`` (``logits/ood/<ood_name>.npz``) when
    ``ood_name`` is given.
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
    if ood_name:
        key = train_eval.OOD_KEY
        directory = storage.as_path(train_dir) / "logits"
        out.update(train_eval.read_logits(directory, [key], ood_name))
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
    bootstrap_samples: int = 0,
    confidence: float = 0.95,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Result rows of one trained cell: one per calibrator x evaluation set.

    Args:
      logits: ``{split: (logits, labels)}`` from :func:`load_logits`.
      method: the training method's name.
      seed: the training seed.
      calibrators: names (``'none'`` or registry names).
      num_bins: bins of the binned metrics.
      bootstrap_samples: resamples of the clean test set for the intervals of
        :data:`BOOTSTRAP_METRICS` (0: none); drawn with
        :func:`bootstrap_key` of the cell, the same for every calibrator.
      confidence: the intervals' level.
      progress: optional ``(calibrator) -> None`` called after each
        calibrator is fitted and scored.

    Returns:
      Rows ``{method, calibrator, seed, shift, corruption, severity, **metrics}``
      (with the conformal-set fields of :mod:`conformal_sets`)
      with ``shift='clean'`` (severity 0) for the test set and
      ``'<corruption>/<severity>'`` for shifted sets; the validation set is
      only fitted on, never scored. Clean rows also carry :data:`OOD_FIELDS`
      when ``logits`` holds ``'ood'`` (the calibrated test set against the
      calibrated OOD set) and the bootstrap fields when asked for.
      Binary-only calibrators (``'platt'``, ``'beta'``) give no rows when
      K != 2.
    """
    from calib_jax.benchmark import grid

    val_z, val_y = logits["val"]
    calibrators = grid.applicable(calibrators, val_z.shape[-1])
    ood = logits.get(train_eval.OOD_KEY)
    splits = [s for s in logits if s not in ("val", train_eval.OOD_KEY)]
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
            if "test" in names:  # the calibrated test logits, as scored
                test_z = z[names.index("test")]
            out = jax.device_get(stacked_metrics(z, y, num_bins=num_bins))
            out.update(conformal_sets.scores(predictors, z, y))
            for i, s in enumerate(names):
                values[s] = {k: float(v[i]) for k, v in out.items()}
        if ood is not None:
            scores = train_eval.ood_metrics(test_z, np.asarray(apply(ood[0])))
            values["test"].update({f"ood_{k}": v for k, v in scores.items()})
        if bootstrap_samples:
            values["test"].update(
                bootstrap_fields(
                    test_z,
                    logits["test"][1],
                    key=bootstrap_key(method, seed),
                    num_samples=int(bootstrap_samples),
                    confidence=confidence,
                    num_bins=num_bins,
                )
            )
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
        if progress is not None:
            progress(cal_name)
    return rows
