"""Split-conformal prediction sets for classifiers: THR (LAC), APS and RAPS,
marginal or class-conditional (Mondrian, ``mondrian=True``: one threshold
per class).

``fit(name, logits, labels, *, alpha, key=None)`` calibrates a
:class:`ConformalPredictor` on held-out logits; its
``predict_sets(logits, key=None)`` returns boolean ``[N, K]`` sets that
contain the true label with probability at least ``1 - alpha`` (and at most
``1 - alpha + 1/(n + 1)`` for tie-free scores). ``coverage``, ``set_size``
and ``size_stratified_coverage`` score the sets, ``classwise_coverage`` and
``coverage_gap`` (CovGap) their class-conditional coverage. The conformity scores, the
set rules and the quantile are also pure functions on probabilities
(``thr_score``/``thr_sets``, ``aps_score``/``aps_sets``,
``raps_score``/``raps_sets``, ``conformal_quantile``). See
``docs/conformal.md``.
"""

from calib_jax.conformal._metrics import (
    RAPS_STRATA,
    classwise_coverage,
    classwise_coverage_stats,
    coverage,
    coverage_gap,
    set_size,
    size_stratified_coverage,
    size_stratified_violation,
)
from calib_jax.conformal._mondrian import ABSENT, MondrianPredictor
from calib_jax.conformal._predictor import ConformalPredictor
from calib_jax.conformal._registry import (
    PREDICTORS,
    fit,
    fit_aps,
    fit_raps,
    fit_thr,
    get_predictor,
)
from calib_jax.conformal._scores import (
    aps_score,
    aps_sets,
    conformal_quantile,
    quantile_rank,
    raps_score,
    raps_sets,
    thr_score,
    thr_sets,
)
from calib_jax.conformal._streamed import fit_of_chunks

__all__ = [
    "ABSENT",
    "PREDICTORS",
    "RAPS_STRATA",
    "ConformalPredictor",
    "MondrianPredictor",
    "aps_score",
    "aps_sets",
    "classwise_coverage",
    "classwise_coverage_stats",
    "conformal_quantile",
    "coverage",
    "coverage_gap",
    "fit",
    "fit_aps",
    "fit_of_chunks",
    "fit_raps",
    "fit_thr",
    "get_predictor",
    "quantile_rank",
    "raps_score",
    "raps_sets",
    "set_size",
    "size_stratified_coverage",
    "size_stratified_violation",
    "thr_score",
    "thr_sets",
]
