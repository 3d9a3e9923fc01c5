r"""CORP decomposition of the Brier and log scores: MCB - DSC + UNC."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks
from calib_jax.metrics import _calibration_tests, _validate

SCORES = ("brier", "log")


class Decomposition(NamedTuple):
    """A mean score split as ``score = miscalibration - discrimination +
    uncertainty`` (float32 scalars).

    Attributes:
      score: the mean score :math:`\\bar S_X` of the forecasts.
      miscalibration: MCB, :math:`\\bar S_X - \\bar S_C` (>= 0).
      discrimination: DSC, :math:`\\bar S_R - \\bar S_C` (>= 0).
      uncertainty: UNC, :math:`\\bar S_R`, the score of the base rate.
    """

    score: jax.Array
    miscalibration: jax.Array
    discrimination: jax.Array
    uncertainty: jax.Array


def _score(x: np.ndarray, o: np.ndarray, score: str) -> float:
    """Mean score of forecasts ``x`` for 0/1 outcomes ``o`` (float64)."""
    if score == "brier":
        return float(np.mean((x - o) ** 2))
    # Natural log; 0 log 0 = 0, so a forecast of 0 or 1 that was right
    # scores 0 and one that was wrong scores +inf (nothing is clipped).
    with np.errstate(divide="ignore"):
        hit = np.where(o > 0, np.log(np.where(o > 0, x, 1.0)), 0.0)
        miss = np.where(o > 0, 0.0, np.log(np.where(o > 0, 1.0, 1.0 - x)))
    return float(-np.mean(hit + miss))


def isotonic_recalibration(x: np.ndarray, o: np.ndarray) -> np.ndarray:
    """The CORP recalibrated forecasts: the isotonic (PAV) fit of 0/1 ``o`` on
    ``x`` (host, float64 ``[N]``), equal forecasts pooled first so they get
    equal values (as scikit-learn's ``IsotonicRegression``)."""
    from scipy.optimize import isotonic_regression

    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    positives = np.bincount(
        inverse, weights=o.astype(np.float64), minlength=values.size
    )
    fitted = isotonic_regression(positives / counts, weights=counts).x
    return fitted[inverse]


@functools.partial(jax.jit, static_argnums=3)
def _forecasts(probs, labels, where, mode):
    return _calibration_tests.forecast_outcome(probs, labels, mode)


def corp_decomposition(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    score: str = "brier",
    mode: str = "top_label",
    where: jax.typing.ArrayLike | None = None,
) -> Decomposition:
    r"""CORP decomposition of a mean score into MCB, DSC and UNC (batch-level).

    With forecasts :math:`x_i` and events :math:`o_i \in \{0, 1\}`
    (``mode='top_label'``: top-label confidence and whether the prediction
    is correct; ``mode='binary'``: :math:`p_{i1}` and :math:`[y_i = 1]`),
    the CORP approach of [1] recalibrates the forecasts by isotonic
    regression, :math:`\hat x_i` = the pool-adjacent-violators fit of
    :math:`o` on :math:`x` with equal forecasts pooled
    and splits the mean score :math:`\bar S_X` as the CORP score
    decomposition of [1]:

    .. math::

        \bar S_X = \underbrace{\bar S_X - \bar S_C}_{\mathrm{MCB}}
        - \underbrace{(\bar S_R - \bar S_C)}_{\mathrm{DSC}}
        + \underbrace{\bar S_R}_{\mathrm{UNC}},

    where :math:`\bar S_C` is the mean score of :math:`\hat x` and
    :math:`\bar S_R` that of the constant base rate :math:`r = \bar o`.
    Because the isotonic fit minimises every proper score among
    non-decreasing maps, MCB >= 0 and DSC >= 0, and MCB = 0 exactly when the
    forecasts are already their own isotonic fit.

    ``score='brier'``: :math:`s(x, o) = (x - o)^2`, so in top-label mode the
    score is the binary Brier score of (confidence, correct), not the
    multiclass :func:`~calib_jax.metrics.brier` (in binary mode it is half
    of it). ``score='log'``: :math:`s(x, o) = -o \log x - (1 - o)\log(1 -
    x)` in nats, nothing clipped: a forecast of 0 or 1 that was wrong scores
    :math:`+\infty`, which makes the score and MCB infinite (the isotonic
    fit's score is always finite).

    **Host function** (float64, SciPy's PAV): the isotonic fit has no static
    shape, so it is not jittable and not mergeable across batches.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex (not logits).
      labels: int ``[N]`` class ids in ``[0, K)``.
      score: ``'brier'`` or ``'log'``.
      mode: ``'top_label'`` (any K) or ``'binary'`` (K = 2).
      where: optional bool ``[N]``; ``False`` rows are excluded.

    Returns:
      :class:`Decomposition` of float32 scalars (computed in float64).

    Raises:
      ValueError: a bad option, bad inputs (one line), or traced inputs.

    References:
      [1] T. Dimitriadis, T. Gneiting, A. I. Jordan, "Stable reliability
      diagrams for probabilistic classifiers", PNAS 118(8):e2016191118, 2021,
      arXiv:2008.03033: the CORP reliability diagram (PAV recalibration) and
      the CORP score decomposition MCB - DSC + UNC (equation numbers not pinned).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([1, 0, 0, 1])
      >>> d = metrics.corp_decomposition(probs, labels, mode="binary")
      >>> print(" ".join(f"{float(v):.4f}" for v in d))
      0.3750 0.2083 0.0833 0.2500
    """
    _checks.check_choice("score", score, SCORES)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    _calibration_tests.check_mode(mode, probs.shape[1])
    if not _checks.is_concrete(probs, labels, where):
        raise ValueError(
            "corp_decomposition runs on the host (its isotonic fit has no "
            "static shape): call it outside jax.jit/jax.vmap."
        )
    x, o = jax.device_get(_forecasts(probs, labels, where, mode))
    if where is not None:
        keep = np.asarray(where)
        x, o = x[keep], o[keep]
    x = np.asarray(x, np.float64)
    o = np.asarray(o, np.float64)
    s_x = _score(x, o, score)
    s_c = _score(isotonic_recalibration(x, o), o, score)
    s_r = _score(np.full_like(x, np.mean(o)), o, score)
    values = (s_x, s_x - s_c, s_r - s_c, s_r)
    return Decomposition(*(jnp.asarray(v, jnp.float32) for v in values))
