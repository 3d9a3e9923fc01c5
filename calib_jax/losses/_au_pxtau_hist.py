r"""AU_Pxτ's histogram (Zhou et al. 2025, Eqs. (14)-(15)): the smoothed CDF, its
quantile, the running state, and the released code's score, bins and CDF."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import clamp, first_max, row_stats, zero_excluded_logits
from calib_jax.losses._confidence import (
    bin_edges,
    check_csf,
    csf_flags,
    csf_score,
    histogram,
)
from calib_jax.losses._validation_base import (
    check_logits,
    check_unit_interval,
    check_variant,
    reject,
    valid_mask,
)

_AU_EPS = 1e-9  # selectAU.py / aurc.py: clamp of the softmax probabilities
_AU_TINY = 1e-12  # hist_rank.py: floor of the bin counts and of the total


def coverage_threshold(hist, edges, coverage) -> jax.Array:
    """τ with a fraction ``coverage`` of the histogram mass below it, linearly
    interpolated inside its bin (no sort)."""
    num_bins = hist.shape[0]
    cum = jnp.cumsum(hist)
    target = coverage * cum[-1]
    k = jnp.minimum(jnp.sum(cum < target), num_bins - 1)
    below = cum[k] - hist[k]
    frac = jnp.clip((target - below) / jnp.maximum(hist[k], 1e-30), 0.0, 1.0)
    return edges[k] + frac * (edges[k + 1] - edges[k])


def log_survival(score, hist, centres, nu) -> jax.Array:
    """``log(1 - Ĝ_ν(score))`` of Eq. (15), ``[B]``: ``1 - Ĝ_ν(s) = sum_k h_k
    sigmoid((c_k - s) / ν) / n``, a weighted logsumexp of log-sigmoids (no
    cancellation, no underflow)."""
    n = jnp.maximum(jnp.sum(hist), 1.0)
    a = jax.nn.log_sigmoid((centres[None, :] - score[:, None]) / nu)
    occupied = hist > 0
    log_h = jnp.log(jnp.where(occupied, hist, 1.0))
    a = jnp.where(occupied[None, :], a + log_h[None, :], -jnp.inf)
    return jax.nn.logsumexp(a, axis=-1) - jnp.log(n)


def au_pxtau_update_hist(
    hist: jax.typing.ArrayLike,
    logits: jax.typing.ArrayLike,
    *,
    csf: str = "msp",
    decay: jax.typing.ArrayLike = 1.0,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Adds a batch's confidence-score counts to a running AU_Pxτ histogram.

    .. math::

        h^{\text{new}}_k = \text{decay}\cdot h_k + \sum_{i} 1[e_k \le g_i < e_{k+1}]

    (Eq. (14) of [1], the bins of :func:`au_pxtau`). Start from
    ``jnp.zeros(num_bins)``; ``decay=1`` accumulates counts (zero the state to
    forget, e.g. every epoch), ``decay < 1`` keeps a moving histogram. Call it
    *before* :func:`au_pxtau` on the same batch (Algorithm 1, line 4) and pass
    the result as ``hist``. The counts carry no gradient.

    Args:
      hist: float ``[M]`` running counts; ``M`` sets the number of bins.
      logits: float ``[B, K]`` unnormalised log-probabilities.
      csf: static str, ``'msp'``, ``'neg_entropy'`` or ``'softmax_margin'``.
      decay: factor in [0, 1] applied to ``hist`` before adding the batch.
      variant: static str; ``'released_code'`` counts the released score
        (see :func:`au_pxtau`) in equal-width bins on [0, 1].
      where: optional bool ``[B]``; ``False`` rows are not counted.

    Returns:
      float32 ``[M]``, the updated counts (global over a data-sharded batch).

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration", 2025,
      Eq. (14) and Algorithm 1.

    Examples:
      >>> import jax.numpy as jnp
      >>> h = au_pxtau_update_hist(jnp.zeros(4), jnp.array([[0.0, 0.0], [5.0, 0.0]]))
      >>> print(h.tolist())
      [0.0, 0.0, 1.0, 1.0]
    """
    csf = check_csf(csf)
    variant = check_variant(variant)
    check_unit_interval("decay", decay, closed_left=True)
    if variant == "released_code" and (
        isinstance(decay, jax.core.Tracer) or float(decay) != 1.0
    ):
        reject(
            "au_pxtau_update_hist",
            f"decay={decay!r} (its histogram adds plain counts and is reset every "
            "epoch: pass decay=1 and zero the state)",
        )
    hist = jnp.asarray(hist)
    if hist.ndim != 1 or hist.shape[0] < 1:
        raise ValueError(f"hist must have shape [num_bins], got {hist.shape}.")
    logits = check_logits(logits)
    mask = valid_mask(where, logits.shape[0])
    return _update_hist(hist, logits, mask, decay, csf=csf, variant=variant)


@functools.partial(jax.jit, static_argnames=("csf", "variant"))
def _update_hist(hist, logits, mask, decay, *, csf, variant):
    logits = zero_excluded_logits(logits, mask)
    if variant == "released_code":
        score = au_score(logits, csf)
        edges = au_edges(hist.shape[0], logits.dtype)
    else:
        score = csf_score(csf, row_stats(logits, **csf_flags(csf)))
        edges = bin_edges(csf, logits.shape[-1], hist.shape[0], logits.dtype)
    counts = histogram(score, mask, edges)
    return jnp.asarray(decay, counts.dtype) * hist.astype(counts.dtype) + counts


# The released code (han678/CalibWeightedRisk, loss/selectAU.py, loss/aurc.py,
# loss/hist_rank.py): the differences ``au_pxtau``'s docstring lists.


def au_score(logits: jax.Array, csf: str) -> jax.Array:
    """The released confidence score of ``SelectiveAULoss``, ``[B]``: 'msp' and
    'softmax_margin' of a second softmax of ``s = clamp(softmax(z))``;
    'neg_entropy' ``sum s log s`` normalised and clamped to [0, 1] (always 1)."""
    k = logits.shape[1]
    s = clamp(jax.nn.softmax(logits, axis=1), _AU_EPS, 1.0 - _AU_EPS)
    if csf == "neg_entropy":
        g = jnp.sum(s * jnp.log(s), axis=1)
        log_k = jnp.log(jnp.asarray(k, logits.dtype))
        return clamp((g - log_k) / (0.0 - log_k), 0.0, 1.0)
    q = clamp(jax.nn.softmax(s, axis=1), _AU_EPS, 1.0 - _AU_EPS)
    top = first_max(q)
    if csf == "msp":
        return top
    # torch.topk(q, 2): the runner-up is the first maximum without the top index.
    idx = jnp.argmax(lax.stop_gradient(q), axis=1).astype(jnp.int32)
    cols = lax.broadcasted_iota(jnp.int32, q.shape, 1)
    second = first_max(jnp.where(cols == idx[:, None], -jnp.inf, q))
    return top - second


def au_edges(num_bins: int, dtype) -> jax.Array:
    """``torch.linspace(0, 1, M + 1)``, the released bin edges for every CSF."""
    return jnp.arange(num_bins + 1, dtype=dtype) / num_bins


def au_cdf(x: jax.Array, counts: jax.Array, centres: jax.Array, nu) -> jax.Array:
    """``DifferentiableHistogramCDF.cdf``: sigmoids weighted by the counts over
    the total (both floored at 1e-12)."""
    w = jnp.maximum(counts, _AU_TINY)
    total = jnp.maximum(jnp.sum(counts), _AU_TINY)
    sig = jax.nn.sigmoid((x[:, None] - centres[None, :]) / nu)
    return jnp.sum(sig * w[None, :], axis=1) / total


def batch_quantile(x: jax.Array, mask: jax.Array, q) -> jax.Array:
    """``torch.quantile(x, q)`` (linear interpolation) over the unmasked rows,
    differentiable in ``x``; ties keep their batch order (stable sort)."""
    dtype = x.dtype
    n = jnp.sum(mask.astype(jnp.int32))
    xs = jnp.sort(jnp.where(mask, x, jnp.inf))
    pos = jnp.asarray(q, dtype) * (n - 1).astype(dtype)
    lo = jnp.floor(pos)
    frac = pos - lo
    lo_i = lo.astype(jnp.int32)
    hi_i = jnp.minimum(lo_i + 1, jnp.maximum(n - 1, 0))
    x_lo = xs[lo_i]
    x_hi = jnp.where(hi_i > lo_i, xs[hi_i], x_lo)
    return x_lo + frac * (x_hi - x_lo)
