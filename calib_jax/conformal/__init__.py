"""Split-conformal prediction sets for classifiers: THR (LAC), APS and RAPS.

``fit(name, logits, labels, *, alpha, key=None)`` calibrates a
:class:`ConformalPredictor` on held-out logits; its
``predict_sets(logits, key=None)`` returns boolean ``[N, K]`` sets that
contain the true label with probability at least ``1 - alpha`` (and at most
``1 - alpha + 1/(n + 1)`` for tie-free scores). ``coverage``, ``set_size``
and ``size_stratified_coverage`` score the sets. The conformity scores, the
set rules and the quantile are also pure functions on probabilities
(``thr_score``/``thr_sets``, ``aps_score``/``aps_sets``,
``raps_score``/``raps_sets``, ``conformal_quantile``). See
``docs/conformal.md``.
"""

from calib_jax.conformal._metrics import (
    RAPS_STRATA,
    coverage,
    set_size,
    size_stratified_coverage,
    size_stratified_violation,
)
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

__all__ = [
    "PREDICTORS",
    "RAPS_STRATA",
    "ConformalPredictor",
    "aps_score",
    "aps_sets",
    "conformal_quantile",
    "coverage",
    "fit",
    "fit_aps",
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
