"""Calibration, proper-scoring, selective and OOD metrics.

Every metric is ``calib_jax.metrics.<name>(probs, labels, *, <options>,
where=None)`` and returns a float32 scalar ``jax.Array`` (``ood_auroc``,
``ood_aupr`` and ``fpr_at_95_tpr`` take ``(scores_in, scores_out)``).
``from_logits=True`` takes ``[N, K]`` logits instead; top-label metrics
also take :class:`TopLabelRows` with ``labels=None``. Eager calls validate
values and raise ``ValueError``; inside ``jax.jit`` the checks are skipped.
Per-row OOD scores, calibration tests, :func:`corp_decomposition`,
:func:`bootstrap` intervals, mergeable :class:`BinnedStats`, binning
:data:`PRESETS` and :func:`summary_of_chunks`: ``docs/metrics.md`` and
``docs/streaming.md``.
"""

from calib_jax.metrics._adaptive import adaptive_ece
from calib_jax.metrics._aurc import aurc, eaurc
from calib_jax.metrics._binned_stats import BinnedStats
from calib_jax.metrics._bootstrap import BootstrapResult, bootstrap, resample_indices
from calib_jax.metrics._calibration_tests import (
    CalibrationTest,
    SpiegelhalterStats,
    ece_consistency_test,
    spiegelhalter_test,
)
from calib_jax.metrics._classwise import classwise_ece, debiased_ece, marginal_ece
from calib_jax.metrics._conventions import PRESETS, Convention, get_convention
from calib_jax.metrics._decomposition import Decomposition, corp_decomposition
from calib_jax.metrics._ece import ece, mce, reliability_bins, rmsce
from calib_jax.metrics._inputs import TopLabelRows, top_label_rows
from calib_jax.metrics._ks_sweep import ks_error, sweep_ece
from calib_jax.metrics._multilabel import multilabel_ece
from calib_jax.metrics._multilabel_stats import MultilabelStats
from calib_jax.metrics._ood import fpr_at_95_tpr, ood_aupr, ood_auroc
from calib_jax.metrics._ood_scores import (
    OOD_SCORES,
    energy_score,
    entropy_score,
    max_logit_score,
    max_softmax_score,
    mutual_information,
    mutual_information_score,
    ood_score,
)
from calib_jax.metrics._proper import accuracy, brier, nll
from calib_jax.metrics._risk_coverage import augrc, coverage_at_risk, risk_at_coverage
from calib_jax.metrics._smooth import smooth_ece, smooth_reliability
from calib_jax.metrics._summary import (
    SPLIT_METRICS,
    SUMMARY_METRICS,
    summary,
    summary_functions,
)
from calib_jax.metrics._streamed import summary_of_chunks

METRICS = {
    "ece": ece,
    "mce": mce,
    "rmsce": rmsce,
    "adaptive_ece": adaptive_ece,
    "classwise_ece": classwise_ece,
    "marginal_ece": marginal_ece,
    "debiased_ece": debiased_ece,
    "ks_error": ks_error,
    "sweep_ece": sweep_ece,
    "smooth_ece": smooth_ece,
    "brier": brier,
    "nll": nll,
    "accuracy": accuracy,
    "aurc": aurc,
    "eaurc": eaurc,
    "augrc": augrc,
    "risk_at_coverage": risk_at_coverage,
    "coverage_at_risk": coverage_at_risk,
    "ood_auroc": ood_auroc,
    "ood_aupr": ood_aupr,
    "fpr_at_95_tpr": fpr_at_95_tpr,
    "reliability_bins": reliability_bins,
    "smooth_reliability": smooth_reliability,
}


def get_metric(name: str):
    """Returns the metric function registered under ``name``.

    Raises:
      ValueError: unknown name; the message lists the known metrics.
    """
    try:
        return METRICS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown metric {name!r}; known metrics: {', '.join(sorted(METRICS))}."
        ) from None


__all__ = [
    "METRICS",
    "OOD_SCORES",
    "PRESETS",
    "SPLIT_METRICS",
    "SUMMARY_METRICS",
    "BinnedStats",
    "BootstrapResult",
    "CalibrationTest",
    "Convention",
    "Decomposition",
    "MultilabelStats",
    "SpiegelhalterStats",
    "TopLabelRows",
    "accuracy",
    "adaptive_ece",
    "augrc",
    "aurc",
    "bootstrap",
    "brier",
    "classwise_ece",
    "corp_decomposition",
    "coverage_at_risk",
    "debiased_ece",
    "eaurc",
    "ece",
    "ece_consistency_test",
    "energy_score",
    "entropy_score",
    "fpr_at_95_tpr",
    "get_convention",
    "get_metric",
    "ks_error",
    "marginal_ece",
    "max_logit_score",
    "max_softmax_score",
    "mce",
    "multilabel_ece",
    "mutual_information",
    "mutual_information_score",
    "nll",
    "ood_aupr",
    "ood_auroc",
    "ood_score",
    "reliability_bins",
    "resample_indices",
    "risk_at_coverage",
    "rmsce",
    "smooth_ece",
    "smooth_reliability",
    "spiegelhalter_test",
    "summary",
    "summary_of_chunks",
    "summary_functions",
    "sweep_ece",
    "top_label_rows",
]
