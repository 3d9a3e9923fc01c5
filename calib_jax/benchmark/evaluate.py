"""Post-hoc calibration and metrics of one trained cell: logits in, result rows out.

Every calibrator is fitted on the cell's validation logits and applied to the
clean test logits, to every shifted test set and to the OOD set. All
evaluation sets of one size are stacked and every metric is computed for all
of them in one jitted, vmapped call. The clean row of each calibrator also
carries OOD detection scores (:data:`OOD_FIELDS`) and bootstrap percentile
intervals of :data:`BOOTSTRAP_METRICS` (``<metric>_lo``, ``<metric>_hi``).
Every result row has a reliability row with the per-bin data of its set
(:func:`cell_results`), from which the report draws its reliability diagrams.

Every row also carries Spiegelhalter's calibration test (:data:`TEST_FIELDS`);
a clean row carries the consistency-resampling p-value of its ECE (all
calibrators of a cell in one jitted call) and the CORP decompositions of the
Brier and log scores (:data:`CLEAN_TEST_FIELDS`), and the OOD
detection scores of every OOD score (:func:`ood_field`). A deep ensemble's
logits are made by :func:`ensemble_logits` from its members' runs.
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


def describe(metric: str, num_bins: int = 15) -> str:
    """The description of a row metric (:data:`METRICS`) with its bins as
    configured (``config.num_bins``; the descriptions say the default, 15)."""
    return METRICS[metric].replace("15 equal-", f"{num_bins} equal-")


# Row keys of the OOD scores (test split positive, maximum softmax probability).
OOD_FIELDS: dict[str, str] = {
    "ood_auroc": "AUROC",
    "ood_aupr_in": "AUPR-In",
    "ood_aupr_out": "AUPR-Out",
    "ood_fpr_at_95_tpr": "FPR at 95% TPR",
}
# The OOD scores of the rows (calib_jax.metrics.OOD_SCORES), with the paper
# of each: 'msp' gives the fields of OOD_FIELDS; every other score
# ood_<score>_<metric> (:func:`ood_field`). 'mutual_information' is scored
# for rows with several predictions per example: ensembles and MC dropout.
OOD_SCORES: dict[str, str] = {
    "msp": "maximum softmax probability (Hendrycks & Gimpel 2017)",
    "max_logit": "maximum logit (Hendrycks et al. 2022)",
    "energy": "energy, logsumexp of the logits (Liu et al. 2020, Eq. 1-2)",
    "entropy": "minus the predictive entropy",
    "mutual_information": (
        "minus the mutual information of the members or dropout samples "
        "(Depeweg et al. 2018; Gal 2016)"
    ),
}
# Spiegelhalter's Z test of the top-label confidence (calib_jax.metrics.
# spiegelhalter_test), on every set.
TEST_FIELDS = ("spiegelhalter_z", "spiegelhalter_p")
# Scores decomposed by CORP (calib_jax.metrics.corp_decomposition, top-label)
# and the parts of each decomposition.
CORP_SCORES = ("brier", "log")
CORP_PARTS = ("score", "mcb", "dsc", "unc")
# Clean-row fields: the ECE's consistency-resampling p-value (Broecker & Smith
# 2007) and corp_<score>_<part> of every score and part.
CLEAN_TEST_FIELDS = ("ece_consistency_p",) + tuple(
    f"corp_{s}_{p}" for s in CORP_SCORES for p in CORP_PARTS
)
_CONSISTENCY_SEED = 30_000


def ood_field(score: str, metric: str) -> str:
    """The row key of ``metric`` (a key of :data:`OOD_FIELDS` without ``ood_``)
    by OOD ``score``; the MSP keys are those of :data:`OOD_FIELDS`."""
    return f"ood_{metric}" if score == "msp" else f"ood_{score}_{metric}"


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


def consistency_key(method: str, seed: int) -> jax.Array:
    """The fixed key of a cell's ECE consistency resampling (every calibrator
    shares its resamples)."""
    key = jax.random.key(_CONSISTENCY_SEED)
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


@jax.jit
def stacked_tests(logits: jax.Array, labels: jax.Array):
    """Spiegelhalter's Z test (top-label) of ``S`` evaluation sets of one size.

    Args:
      logits: float ``[S, N, K]`` (calibrated) logits.
      labels: int ``[S, N]`` labels.

    Returns:
      ``{spiegelhalter_z, spiegelhalter_p: float32 [S]}``
      (:func:`calib_jax.metrics.spiegelhalter_test`).
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    test = jax.vmap(metrics.spiegelhalter_test)(probs, labels)
    return {"spiegelhalter_z": test.statistic, "spiegelhalter_p": test.p_value}


@functools.partial(jax.jit, static_argnames=("num_samples", "num_bins"))
def consistency_p_values(
    logits: jax.Array, labels: jax.Array, *, key, num_samples: int, num_bins: int = 15
) -> jax.Array:
    """The ECE consistency test's p-values of ``C`` calibrators' logits of one set.

    Args:
      logits: float ``[C, N, K]``: the test set after each calibrator.
      labels: int ``[N]`` labels.
      key: the resampling key, shared by every calibrator (one call: one
        compile per grid).
      num_samples: static consistency resamples.
      num_bins: static equal-width bins of the ECE.

    Returns:
      float32 ``[C]`` p-values of :func:`calib_jax.metrics.ece_consistency_test`
      (Broecker & Smith 2007).
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jax.vmap(
        lambda p: (
            metrics.ece_consistency_test(
                p, labels, key=key, num_samples=num_samples, num_bins=num_bins
            ).p_value
        )
    )(probs)


def corp_fields(logits, labels) -> dict[str, float]:
    """``corp_<score>_<part>`` of one set: the top-label CORP decompositions
    (Dimitriadis, Gneiting & Jordan 2021; :func:`calib_jax.metrics.
    corp_decomposition`, a host function) of :data:`CORP_SCORES` into
    :data:`CORP_PARTS` (score, MCB, DSC, UNC)."""
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    out = {}
    for score in CORP_SCORES:
        d = metrics.corp_decomposition(probs, jnp.asarray(labels), score=score)
        parts = (d.score, d.miscalibration, d.discrimination, d.uncertainty)
        out.update(
            {
                f"corp_{score}_{n}": float(v)
                for n, v in zip(CORP_PARTS, parts, strict=True)
            }
        )
    return out


# Jitted, so without the eager NaN/inf screen: histogram binning and isotonic
# regression give log(0) = -inf logits to classes of probability 0, which every
# score handles (a max, a logsumexp, 0 log 0 = 0).
_ood_score = jax.jit(metrics.ood_score, static_argnums=0)


def ood_fields(
    test_logits, ood_logits, *, test_mi=None, ood_mi=None
) -> dict[str, float]:
    """OOD detection of the test set (positive) against the OOD set, every score.

    The MSP fields are :func:`calib_jax.train.evaluate.ood_metrics`'s
    (:data:`OOD_FIELDS`); ``max_logit``, ``energy`` and ``entropy``
    (:func:`calib_jax.metrics.ood_score` of the calibrated logits) give
    :func:`ood_field` keys of the same four metrics, and so does
    ``mutual_information`` when ``test_mi`` and ``ood_mi`` (per-row mutual
    information ``[N]``, scored as its negative) are given. Logits may
    hold ``-inf`` (a class of probability 0 after histogram binning or
    isotonic regression).
    """
    out = {
        ood_field("msp", k): v
        for k, v in train_eval.ood_metrics(test_logits, ood_logits).items()
    }
    scores = {
        name: (
            _ood_score(name, jnp.asarray(test_logits, jnp.float32)),
            _ood_score(name, jnp.asarray(ood_logits, jnp.float32)),
        )
        for name in ("max_logit", "energy", "entropy")
    }
    if test_mi is not None and ood_mi is not None:
        scores["mutual_information"] = (
            -jnp.asarray(test_mi, jnp.float32),
            -jnp.asarray(ood_mi, jnp.float32),
        )
    for name, (s_in, s_out) in scores.items():
        values = {
            "auroc": metrics.ood_auroc(s_in, s_out),
            "aupr_in": metrics.ood_aupr(s_in, s_out, positive="in"),
            "aupr_out": metrics.ood_aupr(s_in, s_out, positive="out"),
            "fpr_at_95_tpr": metrics.fpr_at_95_tpr(s_in, s_out),
        }
        out.update({ood_field(name, k): float(v) for k, v in values.items()})
    return out


def _logit_files(train_dir: epath.Path) -> dict[str, epath.Path]:
    """``{split: path}`` of a run's exported ``logits/*.npz`` (OOD set aside)."""
    out = {}
    for path in sorted((train_dir / "logits").glob("*.npz")):
        name = path.stem
        if name.startswith("shift_"):
            corruption, _, severity = name[len("shift_") :].rpartition("_")
            name = f"{corruption}/{severity}"
        out[name] = path
    return out


def load_mutual_information(
    train_dir: epath.Path, ood_name: str = ""
) -> dict[str, np.ndarray]:
    """``{split: float32 [N]}`` of the per-row mutual information an MC-dropout
    run exported (field ``mutual_information``) for ``test`` and the OOD set
    (``'ood'``); ``{}`` for a run without it."""
    directory = train_dir / "logits"
    paths = {"test": directory / "test.npz"}
    if ood_name:
        key = train_eval.OOD_KEY
        paths[key] = directory / train_eval.logits_file(key, ood_name)
    out = {}
    for split, path in paths.items():
        if path.exists():
            f = storage.load_npz(path)
            if "mutual_information" in f:
                out[split] = np.asarray(f["mutual_information"], np.float32)
    return out if "test" in out else {}


def _log_softmax64(z) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def ensemble_logits(
    train_dirs, ood_name: str = ""
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """A deep ensemble's logits of every split, from its members' exported logits.

    Deep ensembles (Lakshminarayanan et al. 2017, Sec. 2.4): the prediction is
    the mean of the members' softmax probabilities; its logits are the log of
    that mean, ``log(1/M sum_m softmax(z_m))``, computed in float64 (a
    log-mean-exp of the members' log-softmax) and stored as float32, so every
    calibrator is fitted on and applied to these log-probabilities. One split
    is read at a time (the members' files of that split), so memory holds one
    split of every member, not every split.

    Args:
      train_dirs: the members' training runs (``M >= 1`` directories).
      ood_name: the OOD set's name (its logits are read as split ``'ood'``).

    Returns:
      ``(logits, mutual_information)``: ``{split: (logits float32 [N, K],
      labels)}`` as :func:`load_logits` gives it, and ``{split: float32 [N]}``
      of :func:`calib_jax.metrics.mutual_information` of the members' logits
      for ``test`` and ``'ood'`` (the ensemble's OOD score).

    Raises:
      ValueError: a member lacks a split of the first member, or the members'
        labels or shapes of a split differ (runs of different data).
    """
    dirs = list(train_dirs)
    files = [_logit_files(d) for d in dirs]
    if "val" not in files[0] or "test" not in files[0]:
        raise ValueError(
            f"{dirs[0]}/logits lacks val.npz or test.npz; the run did not finish."
        )
    splits = list(files[0])
    if ood_name:
        key = train_eval.OOD_KEY
        for d, f in zip(dirs, files, strict=True):
            f[key] = d / "logits" / train_eval.logits_file(key, ood_name)
        splits.append(key)
    logits, mutual = {}, {}
    for split in splits:
        total, labels, members = None, None, []
        for d, f in zip(dirs, files, strict=True):
            if split not in f or not f[split].exists():
                raise ValueError(
                    f"Ensemble member {d} has no exported logits of split {split!r}; "
                    "its run did not finish."
                )
            data = storage.load_npz(f[split])
            z, y = np.asarray(data["logits"], np.float32), np.asarray(data["labels"])
            if split == train_eval.OOD_KEY:
                y = y.astype(np.int32)  # as calib_jax.train.evaluate.read_logits
            if labels is None:
                labels = y
            elif y.shape != labels.shape or z.shape != members[0].shape:
                raise ValueError(
                    f"Ensemble member {d}: split {split!r} has logits {z.shape}, the "
                    f"first member {members[0].shape}; the members must be runs "
                    "of one dataset."
                )
            elif not np.array_equal(y, labels):
                raise ValueError(
                    f"Ensemble member {d}: the labels of split {split!r} differ from "
                    "the first member's; the members must be runs of one dataset."
                )
            lp = _log_softmax64(z)
            total = lp if total is None else np.logaddexp(total, lp)
            if split in ("test", train_eval.OOD_KEY):
                members.append(z)
            elif not members:
                members.append(z)  # the shape check's reference
        mean = total - np.log(len(dirs))
        logits[split] = (mean.astype(np.float32), labels)
        if split in ("test", train_eval.OOD_KEY):
            mutual[split] = np.asarray(
                metrics.mutual_information(jnp.asarray(np.stack(members))), np.float32
            )
    return logits, mutual


def load_logits(
    train_dir: epath.Path, ood_name: str = ""
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (logits, labels)}`` exported by the trainer.

    Split names: ``val``, ``test``, ``<corruption>/<severity>`` for every
    shifted test set, and ``ood`` (``logits/ood/<ood_name>.npz``) when
    ``ood_name`` is given.
    """
    out = {}
    for path in sorted((train_dir / "logits").glob("*.npz")):
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
        directory = train_dir / "logits"
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
    test_samples: int = 0,
    mutual_information: dict[str, np.ndarray] | None = None,
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
      test_samples: resamples of the ECE consistency test of every clean row
        (0: no ``ece_consistency_p``); drawn with :func:`consistency_key` of
        the cell, the same for every calibrator.
      mutual_information: ``{split: [N]}`` per-row mutual information of an
        ensemble's members or an MC-dropout run's samples for ``'test'`` and
        ``'ood'`` (:func:`ensemble_logits`, :func:`load_mutual_information`):
        the clean rows then also score OOD by it. It does not depend on the
        calibrator, which acts on the mean prediction.
      progress: optional ``(calibrator) -> None`` called after each
        calibrator is fitted and scored.

    Returns:
      ``(rows, reliability)``. Rows are
      ``{method, calibrator, seed, shift, corruption, severity, **metrics}``
      (with the conformal-set fields of :mod:`conformal_sets`)
      with ``shift='clean'`` (severity 0) for the test set and
      ``'<corruption>/<severity>'`` for shifted sets; the validation set is
      only fitted on, never scored. Every row carries :data:`TEST_FIELDS`;
      clean rows also carry :data:`CLEAN_TEST_FIELDS`, the OOD fields of
      every score (:func:`ood_fields`) when ``logits`` holds ``'ood'`` (the
      calibrated test set against the calibrated OOD set) and the bootstrap
      fields when asked for.
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
    rows, reliability, tested = [], [], []
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
            out.update(jax.device_get(stacked_tests(z, y)))
            out.update(conformal_sets.scores(predictors, z, y))
            rel = jax.device_get(stacked_reliability(z, y, num_bins=num_bins))
            for i, s in enumerate(names):
                values[s] = {k: float(v[i]) for k, v in out.items()}
                bins[s] = {k: rel[k][i].tolist() for k in RELIABILITY_BINS}
        tested.append(test_z)
        if ood is not None:
            mi = mutual_information or {}
            values["test"].update(
                ood_fields(
                    test_z,
                    np.asarray(apply(ood[0])),
                    test_mi=mi.get("test"),
                    ood_mi=mi.get(train_eval.OOD_KEY),
                )
            )
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
    clean_rows = [r for r in rows if r["shift"] == "clean"]
    test_y = logits["test"][1]
    p_values = None
    if test_samples:  # every calibrator's resamples in one call
        p_values = jax.device_get(
            consistency_p_values(
                np.stack(tested),
                jnp.asarray(test_y),
                key=consistency_key(method, seed),
                num_samples=int(test_samples),
                num_bins=num_bins,
            )
        )
    for i, (row, z) in enumerate(zip(clean_rows, tested, strict=True)):
        if p_values is not None:
            row["ece_consistency_p"] = float(p_values[i])
        row.update(corp_fields(z, test_y))
    return rows, reliability
