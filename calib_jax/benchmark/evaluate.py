"""Post-hoc calibration and metrics of one trained cell: logits in, result rows out.

Every calibrator is fitted on the cell's validation logits and applied to the
clean test logits, to every shifted test set and to the OOD set. All
evaluation sets of one size are stacked and every metric is computed for all
of them in one jitted, vmapped call. The clean row of each calibrator also
carries OOD detection scores (:data:`OOD_FIELDS`) and bootstrap percentile
intervals of :data:`BOOTSTRAP_METRICS` (``<metric>_lo``, ``<metric>_hi``).
Every result row has a reliability row with the per-bin data of its set
(:func:`cell_results`), from which the report draws its reliability diagrams.
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
from calib_jax.benchmark import conformal_sets, grid
from calib_jax.train import evaluate as train_eval

# Row keys of the metrics, with the convention of each (report headers name it):
# every key of :data:`calib_jax.metrics.SUMMARY_METRICS`, in its order.
METRICS: dict[str, str] = {k: m.description for k, m in metrics.SUMMARY_METRICS.items()}


# Row keys of the OOD scores (test split positive, maximum softmax probability).
OOD_FIELDS: dict[str, str] = {
    "ood_auroc": "AUROC",
    "ood_aupr_in": "AUPR-In",
    "ood_aupr_out": "AUPR-Out",
    "ood_fpr_at_95_tpr": "FPR at 95% TPR",
}
# The file of reliability rows, in a cell's directory and in the workdir.
RELIABILITY_FILE = "reliability.jsonl"
# Per-bin fields of a reliability row (as :func:`calib_jax.metrics.reliability_bins`
# returns them, equal-width bins), besides the row's key fields and its ``ece``.
RELIABILITY_BINS = ("count", "confidence", "accuracy", "lower", "upper")
# Metrics of the report's main tables with per-cell bootstrap intervals.
BOOTSTRAP_METRICS = ("accuracy", "ece_l2_em", "ece", "nll")
_BOOTSTRAP_SEED = 20_000


def bootstrap_key(method: str, seed: int) -> jax.Array:
    """The fixed resampling key of a cell (every calibrator shares its resamples)."""
    key = jax.random.key(_BOOTSTRAP_SEED)
    key = jax.random.fold_in(key, zlib.crc32(method.encode()) & 0x7FFFFFFF)
    return jax.random.fold_in(key, seed)


def bootstrap_fields(
    logits, labels, *, key, num_samples: int, confidence: float, num_bins: int = 15
) -> dict[str, float]:
    """``{<metric>_lo, <metric>_hi}`` of :data:`BOOTSTRAP_METRICS` on one set.

    Percentile intervals of :func:`calib_jax.metrics.bootstrap`, every metric
    on the same ``num_samples`` resamples drawn with ``key``.
    """
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    functions = metrics.summary_functions(num_bins)
    res = metrics.bootstrap(
        {name: functions[name] for name in BOOTSTRAP_METRICS},
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
    return jax.vmap(lambda p, y: metrics.summary(p, y, num_bins=num_bins))(
        probs, labels
    )


@functools.partial(jax.jit, static_argnames="num_bins")
def stacked_reliability(logits: jax.Array, labels: jax.Array, *, num_bins: int = 15):
    """Reliability-diagram bins of ``S`` evaluation sets of one size.

    Args:
      logits: float ``[S, N, K]`` (calibrated) logits.
      labels: int ``[S, N]`` labels.
      num_bins: static number of equal-width bins.

    Returns:
      ``{field: [S, num_bins]}`` of :func:`calib_jax.metrics.reliability_bins`.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jax.vmap(lambda p, y: metrics.reliability_bins(p, y, num_bins=num_bins))(
        probs, labels
    )


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


def cell_rows(logits: dict[str, tuple[np.ndarray, np.ndarray]], **kw) -> list[dict]:
    """The result rows of :func:`cell_results` (same arguments)."""
    return cell_results(logits, **kw)[0]


def cell_results(
    logits: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    method: str,
    seed: int,
    calibrators,
    num_bins: int = 15,
    bootstrap_samples: int = 0,
    confidence: float = 0.95,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Result and reliability rows of one trained cell, one per calibrator x set.

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
      ``(rows, reliability)``. Rows are
      ``{method, calibrator, seed, shift, corruption, severity, **metrics}``
      (with the conformal-set fields of :mod:`conformal_sets`)
      with ``shift='clean'`` (severity 0) for the test set and
      ``'<corruption>/<severity>'`` for shifted sets; the validation set is
      only fitted on, never scored. Clean rows also carry :data:`OOD_FIELDS`
      when ``logits`` holds ``'ood'`` (the calibrated test set against the
      calibrated OOD set) and the bootstrap fields when asked for.
      Binary-only calibrators (``'platt'``, ``'beta'``) give no rows when
      K != 2. ``reliability`` holds, in the same order, the same six key
      fields with the reliability-diagram bins of the set (:data:`RELIABILITY_BINS`,
      ``num_bins`` equal-width bins, lists) and its ``ece``: the data of the
      report's reliability diagrams.
    """
    val_z, val_y = logits["val"]
    calibrators = grid.applicable(calibrators, val_z.shape[-1])
    ood = logits.get(train_eval.OOD_KEY)
    splits = [s for s in logits if s not in ("val", train_eval.OOD_KEY)]
    splits.sort(key=lambda s: (s != "test", s))
    groups: dict[tuple, list[str]] = {}
    for s in splits:
        groups.setdefault(logits[s][0].shape, []).append(s)
    rows, reliability = [], []
    for cal_name in calibrators:
        apply, params = _fit(cal_name, val_z, val_y)
        predictors = conformal_sets.fit(apply(val_z), val_y)
        values: dict[str, dict[str, float]] = {}
        bins: dict[str, dict[str, list]] = {}
        for shape, names in groups.items():
            z = np.stack([logits[s][0] for s in names])
            y = np.stack([logits[s][1] for s in names])
            z = np.asarray(apply(z.reshape(-1, shape[-1]))).reshape(z.shape)
            if "test" in names:  # the calibrated test logits, as scored
                test_z = z[names.index("test")]
            out = jax.device_get(stacked_metrics(z, y, num_bins=num_bins))
            out.update(conformal_sets.scores(predictors, z, y))
            rel = jax.device_get(stacked_reliability(z, y, num_bins=num_bins))
            for i, s in enumerate(names):
                values[s] = {k: float(v[i]) for k, v in out.items()}
                bins[s] = {k: rel[k][i].tolist() for k in RELIABILITY_BINS}
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
            key = {
                "method": method,
                "calibrator": cal_name,
                "seed": int(seed),
                "shift": "clean" if s == "test" else s,
                "corruption": corruption,
                "severity": severity,
            }
            rows.append(
                dict(
                    **key,
                    **values[s],
                    **({"fit": params} if s == "test" and params else {}),
                )
            )
            reliability.append(dict(**key, **bins[s], ece=values[s]["ece"]))
        if progress is not None:
            progress(cal_name)
    return rows, reliability
