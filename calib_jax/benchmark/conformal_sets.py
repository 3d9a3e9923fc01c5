"""Conformal prediction sets of one benchmark cell, after each calibrator.

For every calibrator of a cell, each split-conformal method of
:data:`METHODS` is fitted (non-randomised, at level :data:`ALPHA`) on the
cell's calibrated validation logits and predicts sets for every evaluation
set (clean test and every shifted set). Rows gain the fields
``conformal_<method>_coverage`` and ``conformal_<method>_size`` (mean set
size). The guarantee holds on the clean test set, which is exchangeable with
the validation split; under shift it need not.
"""

from __future__ import annotations

import jax
import numpy as np

from calib_jax import conformal

ALPHA = 0.1
METHODS = ("thr", "aps", "raps")


def field(method: str, what: str) -> str:
    """Row key of ``what`` (``'coverage'`` or ``'size'``) of ``method``."""
    return f"conformal_{method}_{what}"


def fit(val_logits, val_labels) -> dict:
    """``{method: ConformalPredictor}`` fitted on calibrated validation logits.

    Empty when the validation split is too small for :data:`ALPHA`
    (fewer than ``1/ALPHA - 1`` rows); the rows then lack the fields.
    """
    if len(val_labels) < 1 / ALPHA - 1:
        return {}
    z = finite(val_logits)
    return {m: conformal.fit(m, z, val_labels, alpha=ALPHA) for m in METHODS}


def finite(logits) -> np.ndarray:
    """float32 logits with ``-inf`` (a zero probability, as the histogram and
    isotonic calibrators give) as the lowest finite float32: the softmax is
    unchanged, and the conformal fit's input check accepts it."""
    z = np.asarray(logits, np.float32)
    return np.where(np.isneginf(z), np.finfo(np.float32).min, z)


@jax.jit
def _scores(predictors, logits, labels):
    def one(z, y):
        out = {}
        for m, pred in predictors.items():
            sets = pred.predict_sets(z)
            out[field(m, "coverage")] = conformal.coverage(sets, y)
            out[field(m, "size")] = conformal.set_size(sets)
        return out

    return jax.vmap(one)(logits, labels)


def scores(predictors: dict, logits, labels) -> dict:
    """``{field: float32 [S]}`` for ``S`` stacked evaluation sets.

    Args:
      predictors: from :func:`fit` (an empty dict gives no fields).
      logits: float ``[S, N, K]`` calibrated logits.
      labels: int ``[S, N]`` labels.
    """
    if not predictors:
        return {}
    return jax.device_get(_scores(predictors, finite(logits), labels))
