r"""Separating in-distribution from OOD inputs by a score, higher = more
in-distribution (``[N, K]`` probabilities: the MSP); sort-based, once per split."""

from __future__ import annotations

import fractions
import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.metrics import _common, _cpu_kernels, _validate


def _as_scores(x, where, name):
    x = jnp.asarray(x)
    if x.ndim == 2:
        x, _, where = _validate.check_probs_labels(
            x, jnp.zeros((x.shape[0],), jnp.int32), where
        )
        x = jnp.max(_common.as_float(x), axis=1)
    return _validate.check_scores(x, where, name=name)


@kernels.dispatch("sort_keys", _cpu_kernels.ood_ranks)
def ranks(s_in, s_out, v_out):
    """Numbers of included ``s_out`` below and at-or-below each ``s_in``:
    one float sort (``-0.0`` read as ``0.0``) and two binary searches.
    Kernel family ``'sort_keys'`` (``_cpu_kernels.ood_ranks``)."""
    ref = jnp.sort(jnp.where(v_out, s_out.astype(jnp.float32) + 0.0, jnp.inf))
    query = s_in.astype(jnp.float32) + 0.0
    below = jnp.searchsorted(ref, query, side="left")
    return below, jnp.searchsorted(ref, query, side="right")


@jax.jit
def _auroc_core(s_in, s_out, w_in, w_out):
    s_in, s_out = _common.as_float(s_in), _common.as_float(s_out)
    v_in = _common.mask_or_ones(w_in, s_in.shape[0])
    v_out = _common.mask_or_ones(w_out, s_out.shape[0])
    below, at_or_below = ranks(s_in, s_out, v_out)
    n_out = jnp.maximum(jnp.sum(v_out), 1).astype(s_in.dtype)
    frac = 0.5 * (below + at_or_below).astype(s_in.dtype) / n_out
    n_in = jnp.maximum(jnp.sum(v_in), 1).astype(s_in.dtype)
    return jnp.sum(jnp.where(v_in, frac, 0.0)) / n_in


def ood_auroc(
    scores_in: jax.typing.ArrayLike,
    scores_out: jax.typing.ArrayLike,
    *,
    where_in: jax.typing.ArrayLike | None = None,
    where_out: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""AUROC of telling in-distribution (positive) from shifted/OOD inputs.

    .. math::

        \mathrm{AUROC} = \frac{1}{n_{\mathrm{in}} n_{\mathrm{out}}}
        \sum_{i \in \mathrm{in}}\sum_{j \in \mathrm{out}}
        \Big([s_i > s_j] + \tfrac12 [s_i = s_j]\Big),

    the Mann-Whitney form of the area under the ROC curve (ties count half),
    as used for OOD detection with the MSP score in [1].

    Args:
      scores_in: float ``[N_in]`` scores (or ``[N_in, K]`` probabilities, MSP)
        of in-distribution inputs.
      scores_out: float ``[N_out]`` (or ``[N_out, K]``) of shifted/OOD inputs.
      where_in, where_out: optional bool masks; ``False`` rows are excluded.

    Returns:
      float32 scalar in [0, 1]; 0.5 for indistinguishable scores.

    References:
      [1] D. Hendrycks, K. Gimpel, "A Baseline for Detecting Misclassified and
      Out-of-Distribution Examples in Neural Networks", ICLR 2017
      (maximum softmax probability baseline).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> s_in = jnp.array([0.9, 0.8, 0.7, 0.4])
      >>> s_out = jnp.array([0.5, 0.7, 0.3])
      >>> print(f"{float(metrics.ood_auroc(s_in, s_out)):.4f}")
      0.7917
    """
    s_in, w_in = _as_scores(scores_in, where_in, "scores_in")
    s_out, w_out = _as_scores(scores_out, where_out, "scores_out")
    return _auroc_core(s_in, s_out, w_in, w_out)


@kernels.dispatch("sort_keys", _cpu_kernels.ood_accepted)
def accepted(s_in, s_out, v_in, v_out, position):
    """Included ``s_out`` at or above the ``position``-th sorted included
    ``s_in`` (excluded rows first): one float sort (``-0.0`` read as
    ``0.0``). Kernel family ``'sort_keys'`` (``_cpu_kernels.ood_accepted``)."""
    keys = jnp.sort(jnp.where(v_in, s_in.astype(jnp.float32) + 0.0, -jnp.inf))
    return v_out & (s_out.astype(jnp.float32) + 0.0 >= keys[position])


@functools.partial(jax.jit, static_argnums=(4, 5))
def _fpr_core(s_in, s_out, w_in, w_out, num, den):
    s_in, s_out = _common.as_float(s_in), _common.as_float(s_out)
    v_in = _common.mask_or_ones(w_in, s_in.shape[0])
    v_out = _common.mask_or_ones(w_out, s_out.shape[0])
    n_in = jnp.sum(v_in.astype(jnp.int32))
    # k = ceil(n_in * num / den) in int32 without overflow.
    q, r = n_in // den, n_in % den
    k = jnp.clip(q * num + (r * num + den - 1) // den, 1, jnp.maximum(n_in, 1))
    # Position of the k-th largest included score in the ascending sort.
    hits = accepted(s_in, s_out, v_in, v_out, s_in.shape[0] - k)
    n_out = jnp.maximum(jnp.sum(v_out), 1)
    return jnp.sum(hits).astype(jnp.float32) / n_out.astype(jnp.float32)


def fpr_at_95_tpr(
    scores_in: jax.typing.ArrayLike,
    scores_out: jax.typing.ArrayLike,
    *,
    tpr: float = 0.95,
    where_in: jax.typing.ArrayLike | None = None,
    where_out: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""False-positive rate on shifted/OOD inputs at 95% in-distribution recall.

    The threshold :math:`t` is the :math:`k`-th largest in-distribution
    score, :math:`k = \lceil 0.95\, n_{\mathrm{in}} \rceil` (the largest
    threshold accepting at least 95% of in-distribution inputs as
    ``score >= t``); the result is the fraction of OOD scores ``>= t``:

    .. math::

        \mathrm{FPR@95} = \frac{1}{n_{\mathrm{out}}}\sum_{j \in \mathrm{out}}
        [s_j \ge t].

    The first point with TPR >= 0.95 on the ROC curve.

    Args:
      scores_in: float ``[N_in]`` (or ``[N_in, K]`` probabilities, MSP).
      scores_out: float ``[N_out]`` (or ``[N_out, K]``).
      tpr: static target true-positive rate in (0, 1].
      where_in, where_out: optional bool masks; ``False`` rows are excluded.

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] S. Liang, Y. Li, R. Srikant, "Enhancing the Reliability of
      Out-of-Distribution Image Detection in Neural Networks", ICLR 2018
      (FPR at 95% TPR).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> s_in = jnp.array([0.9, 0.8, 0.7, 0.4])
      >>> s_out = jnp.array([0.5, 0.7, 0.3])
      >>> print(f"{float(metrics.fpr_at_95_tpr(s_in, s_out)):.4f}")
      0.6667
    """
    if not 0.0 < float(tpr) <= 1.0:
        raise ValueError(f"tpr must lie in (0, 1], got {tpr}.")
    frac = fractions.Fraction(float(tpr)).limit_denominator(10_000)
    s_in, w_in = _as_scores(scores_in, where_in, "scores_in")
    s_out, w_out = _as_scores(scores_out, where_out, "scores_out")
    return _fpr_core(s_in, s_out, w_in, w_out, frac.numerator, frac.denominator)


@functools.partial(jax.jit, static_argnums=4)
def _aupr_core(s_in, s_out, w_in, w_out, positive_in):
    s_in, s_out = _common.as_float(s_in), _common.as_float(s_out)
    v_in = _common.mask_or_ones(w_in, s_in.shape[0])
    v_out = _common.mask_or_ones(w_out, s_out.shape[0])
    keys = jnp.concatenate([s_in, s_out]).astype(jnp.float32) + 0.0
    if not positive_in:  # OOD is the positive class, ranked by -score
        keys = -keys
    pos = jnp.concatenate([v_in, jnp.zeros_like(v_out)])
    neg = jnp.concatenate([jnp.zeros_like(v_in), v_out])
    if not positive_in:
        pos, neg = neg, pos
    # Excluded rows go last and count as neither class.
    keys = jnp.where(pos | neg, keys, -jnp.inf)
    order = jnp.argsort(keys)[::-1]  # descending score
    keys, pos, neg = keys[order], pos[order], neg[order]
    tp = jnp.cumsum(pos.astype(jnp.int32))
    fp = jnp.cumsum(neg.astype(jnp.int32))
    # A threshold lies between distinct scores: only the last row of a run of
    # tied scores is an operating point (its precision counts the whole run).
    last = jnp.concatenate([keys[1:] != keys[:-1], jnp.ones((1,), bool)])
    tp_at = jnp.where(last, tp, 0)
    before = jnp.concatenate([jnp.zeros((1,), jnp.int32), lax.cummax(tp_at)[:-1]])
    gained = jnp.where(last, tp - before, 0).astype(jnp.float32)
    precision = tp.astype(jnp.float32) / jnp.maximum(tp + fp, 1).astype(jnp.float32)
    n_pos = jnp.maximum(tp[-1], 1).astype(jnp.float32)
    return jnp.sum(gained * precision) / n_pos


def ood_aupr(
    scores_in: jax.typing.ArrayLike,
    scores_out: jax.typing.ArrayLike,
    *,
    positive: str = "in",
    where_in: jax.typing.ArrayLike | None = None,
    where_out: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Area under the precision-recall curve of telling in from OOD inputs.

    The step-wise area (average precision): with the positive class ranked
    by decreasing score (``positive='in'``: in-distribution inputs by
    :math:`s`, "AUPR-In"; ``positive='out'``: OOD inputs by :math:`-s`,
    "AUPR-Out", both reported in [1]) and a threshold between every pair of
    distinct scores,

    .. math::

        \mathrm{AUPR} = \sum_t (R_t - R_{t-1})\, P_t,

    where :math:`P_t` and :math:`R_t` are the precision and recall of
    accepting every input scored at or above threshold :math:`t` (tied
    scores enter together). This is scikit-learn's
    ``average_precision_score``; no interpolation between operating points.

    Args:
      scores_in: float ``[N_in]`` scores (or ``[N_in, K]`` probabilities, MSP)
        of in-distribution inputs; higher = more in-distribution.
      scores_out: float ``[N_out]`` (or ``[N_out, K]``) of OOD inputs.
      positive: ``'in'`` (default) or ``'out'``: which set is the positive
        class.
      where_in, where_out: optional bool masks; ``False`` rows are excluded.

    Returns:
      float32 scalar in [0, 1]; for indistinguishable scores, the share of
      the positive class.

    References:
      [1] D. Hendrycks, K. Gimpel, "A Baseline for Detecting Misclassified and
      Out-of-Distribution Examples in Neural Networks", ICLR 2017,
      arXiv:1610.02136v3, Sec. 2 (AUPR In and AUPR Out).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> s_in = jnp.array([0.9, 0.8, 0.7, 0.4])
      >>> s_out = jnp.array([0.5, 0.7, 0.3])
      >>> print(f"{float(metrics.ood_aupr(s_in, s_out)):.4f}")
      0.8542
    """
    if positive not in ("in", "out"):
        raise ValueError(f"positive must be 'in' or 'out', got {positive!r}.")
    s_in, w_in = _as_scores(scores_in, where_in, "scores_in")
    s_out, w_out = _as_scores(scores_out, where_out, "scores_out")
    return _aupr_core(s_in, s_out, w_in, w_out, positive == "in")
