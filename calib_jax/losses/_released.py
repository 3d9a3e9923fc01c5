r"""The arithmetic of the authors' released code, where it departs from the papers.

Each public loss that has a ``variant=`` keyword dispatches here for
``variant='released_code'``; the public docstring names the repository and file
and lists every difference from the paper. The functions below are the cores
(inputs already checked, masked rows already zeroed); all of them follow
the library's correctness rule where correctness enters (the first arg-max index
equals the label, as ``tf.argmax`` and ``torch.max`` also return it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import masked_mean, zero_masked

# Constants of the released code (named where they are used).
_AU_EPS = 1e-9  # selectAU.py / aurc.py: clamp of the softmax probabilities
_AU_TINY = 1e-12  # hist_rank.py: floor of the bin counts and of the total
_SB_EPS = 1e-5  # secondary_losses.py: EPS mixed into the soft assignment
_MMCE_EPS = 1e-5  # 20ng_mmce.py: added to m^2, n^2, m n
_MMCE_SQRT_EPS = 1e-10  # 20ng_mmce.py: added under the square root


def clamp(x: jax.Array, lo, hi) -> jax.Array:
    """``torch.clamp``: the value clipped to ``[lo, hi]``; the derivative is 1
    inside the closed interval and 0 outside (``jnp.clip`` would halve it at
    the bounds)."""
    lo = jnp.asarray(lo, x.dtype)
    hi = jnp.asarray(hi, x.dtype)
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def first_max(x: jax.Array) -> jax.Array:
    """The row maximum; its derivative goes to the first maximal entry."""
    return _take(x, jnp.argmax(x, axis=1).astype(jnp.int32))


# ---------------------------------------------------------------------------
# Dual focal loss: Linwei94/ICML2023-DualFocalLoss, Losses/dual_focal_loss.py.
# ---------------------------------------------------------------------------


@jax.jit
def dual_focal(logits, labels, mask, gamma):
    """``-(1 - p_y + p_j)^gamma log p_y`` with ``p_j`` the largest probability
    strictly below ``p_y`` (0 when there is none), ``[B]``."""
    # Shifted by the (constant) row max so that nothing is rounded at the
    # magnitude of the logits (1e4 logits would lose 3 digits in float32).
    z = logits - lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    p = jax.nn.softmax(z, axis=1)
    p_y = _take(p, labels)
    # The released mask compares probabilities (torch.lt(p, p_y)); entries at
    # or above p_y, the label's own included, count as 0 in the top-1.
    below = lax.stop_gradient(p < p_y[:, None])
    cand = jnp.where(below, p, 0.0)
    idx = jnp.argmax(lax.stop_gradient(cand), axis=1).astype(jnp.int32)
    p_j = _take(cand, idx)
    # log p_y and 1 - p_y from the log-odds of the label against the rest: the
    # same numbers as the released log_softmax and 1 - p_k, without the float32
    # cancellation of 1 - p_k near 1 (and with exact zero derivatives where p_y
    # underflows).
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    d = _take(z, labels) - jax.nn.logsumexp(rest, axis=1)
    log_py = jax.nn.log_sigmoid(d)
    one_minus_py = jnp.exp(jax.nn.log_sigmoid(-d))
    base = one_minus_py + p_j
    loss = -(base ** jnp.asarray(gamma, z.dtype)) * log_py
    return zero_masked(loss, mask)


# ---------------------------------------------------------------------------
# ACLS: cvlab-yonsei/ACLS, calibrate/losses/acls.py (ACLS.get_reg).
# ---------------------------------------------------------------------------


@jax.jit
def acls(logits, mask, margin, lambda_1, lambda_2):
    """Per-row ACLS penalty of the released ``get_reg``, ``[B]``.

    ``lambda_1 * n_top * ReLU(z_max - M)^2 + lambda_2 / (K - 1) *
    sum_{j: z_j != z_max} ReLU(sg(z_max) - z_j - M)^2``; the batch mean of
    this row value is the released ``pos.sum() / B + neg.sum() / (B (K-1))``.
    """
    z = logits
    dtype = z.dtype
    k = z.shape[1]
    margin = jnp.asarray(margin, dtype)
    top = first_max(z)  # torch max(dim=1): the derivative goes to one index
    top_c = lax.stop_gradient(top)
    is_top = lax.stop_gradient(z == top_c[:, None])
    n_top = jnp.sum(is_top.astype(dtype), axis=1)
    pos = n_top * jax.nn.relu(top - margin) ** 2
    gap = jax.nn.relu(top_c[:, None] - z - margin)
    neg = jnp.sum(jnp.where(is_top, 0.0, gap * gap), axis=1) / (k - 1.0)
    penalty = jnp.asarray(lambda_1, dtype) * pos + jnp.asarray(lambda_2, dtype) * neg
    return zero_masked(penalty, mask)


# ---------------------------------------------------------------------------
# SB-ECE (label-binned): google/uncertainty-baselines,
# experimental/caltrain/secondary_losses.py
# (compute_squared_error_label_binning_tensorflow).
# ---------------------------------------------------------------------------


def sb_ece_lb(conf, acc, mask, temperature, *, num_bins, num_classes):
    """Squared soft-label-binned ECE of the released TF code, a scalar.

    ``conf`` ``[B]`` top probabilities (differentiable), ``acc`` ``[B]`` hard
    correctness (no gradient).
    """
    dtype = conf.dtype
    edges = jnp.linspace(1.0 / num_classes, 1.0, num_bins + 1, dtype=dtype)
    centres = 0.5 * edges[1:] + 0.5 * edges[:-1]
    # exp(-(b - p)^2 / T) normalised over the bins: a softmax (same value, no
    # underflow of the denominator at small T).
    c_pre = jax.nn.softmax(
        -((centres[None, :] - conf[:, None]) ** 2) / jnp.asarray(temperature, dtype),
        axis=1,
    )
    c = (1.0 - _SB_EPS) * c_pre + _SB_EPS / num_bins
    c = jnp.where(mask[:, None], c, 0.0)
    a_bar = jnp.sum(c * acc[:, None], axis=0) / jnp.sum(c, axis=0)
    sq = jnp.sum(c * (a_bar[None, :] - conf[:, None]) ** 2)
    n = jnp.maximum(jnp.sum(mask.astype(dtype)), 1.0)
    return sq / n


# ---------------------------------------------------------------------------
# Weighted MMCE: aviralkumar2907/MMCE, 20ng_mmce.py (calibration_mmce_w_loss).
# ---------------------------------------------------------------------------


def mmce_weighted(r, c, mask, bandwidth):
    """Released MMCE_w from confidences ``r`` and correctness ``c`` ``[B]``."""
    dtype = r.dtype
    mf = mask.astype(dtype)
    cm = c * mf
    im = (1.0 - c) * mf
    m = jnp.sum(cm)
    n = jnp.sum(im)
    kernel = jnp.exp(-jnp.abs(r[:, None] - r[None, :]) / jnp.asarray(bandwidth, dtype))
    u = cm * (1.0 - r)  # correct rows: 1 - r
    v = im * r  # incorrect rows: r
    s_cc = jnp.sum(u * (kernel @ u))
    s_ii = jnp.sum(v * (kernel @ v))
    s_ci = jnp.sum(u * (kernel @ v))
    # The first normalisation: the mean of each weighted kernel block
    # (tf.reduce_mean over m x m, n x n, m x n entries) ...
    m1 = jnp.maximum(m, 1.0)
    n1 = jnp.maximum(n, 1.0)
    cc = s_cc / (m1 * m1)
    ii = s_ii / (n1 * n1)
    ci = s_ci / (m1 * n1)
    # ... then the second: division by m^2, n^2, m n (plus 1e-5).
    mmd = (
        cc / (m * m + _MMCE_EPS)
        + ii / (n * n + _MMCE_EPS)
        - 2.0 * ci / (m * n + _MMCE_EPS)
    )
    both = (m > 0) & (n > 0)
    root = jnp.sqrt(jnp.where(both, mmd, 0.0) + _MMCE_SQRT_EPS)
    return jnp.where(both, root, jnp.zeros_like(root))


# ---------------------------------------------------------------------------
# AU_Pxτ: han678/CalibWeightedRisk, loss/selectAU.py (SelectiveAULoss) with
# loss/hist_rank.py (DifferentiableHistogramCDF) and loss/aurc.py (scores).
# ---------------------------------------------------------------------------


def au_score(logits: jax.Array, csf: str) -> jax.Array:
    """The released confidence score of ``SelectiveAULoss``, ``[B]``.

    ``s = clamp(softmax(z), 1e-9, 1 - 1e-9)``; 'msp' and 'softmax_margin' are
    taken on ``clamp(softmax(s), 1e-9, 1 - 1e-9)`` (the score function applies
    its own softmax to the already-normalised ``s``); 'neg_entropy' is
    ``sum s log s`` normalised as ``clamp((g - log K) / (0 - log K), 0, 1)``,
    which is 1 for every ``g <= 0``.
    """
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
    # torch.topk(q, 2): the runner-up is the first maximum once the top index
    # is taken out.
    idx = jnp.argmax(lax.stop_gradient(q), axis=1).astype(jnp.int32)
    cols = lax.broadcasted_iota(jnp.int32, q.shape, 1)
    second = first_max(jnp.where(cols == idx[:, None], -jnp.inf, q))
    return top - second


def au_edges(num_bins: int, dtype) -> jax.Array:
    """``torch.linspace(0, 1, M + 1)``, the released bin edges for every CSF."""
    return jnp.arange(num_bins + 1, dtype=dtype) / num_bins


def au_cdf(x: jax.Array, counts: jax.Array, centres: jax.Array, nu) -> jax.Array:
    """``DifferentiableHistogramCDF.cdf``: sigmoids weighted by the counts
    (floored at 1e-12), over the total (floored at 1e-12)."""
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


def au_weights(score, mask, counts, nu, coverage, *, num_bins):
    """The released weights ``alpha`` ``[B]`` (0 on masked rows)."""
    dtype = score.dtype
    edges = au_edges(num_bins, dtype)
    centres = 0.5 * (edges[:-1] + edges[1:])
    nu = jnp.asarray(nu, dtype)
    counts = lax.stop_gradient(counts)
    # tau is the batch quantile of the scores and carries their gradient.
    tau = batch_quantile(score, mask, coverage)
    b = jnp.sum(mask.astype(dtype))
    lo, hi = 1.0 / (b + 1.0), b / (b + 1.0)
    g_x = clamp(au_cdf(score, counts, centres, nu), lo, hi)
    g_tau = clamp(au_cdf(tau[None], counts, centres, nu)[0], lo, hi)
    alpha = jnp.where(
        lax.stop_gradient(score >= tau), -jnp.log(1.0 - g_tau), -jnp.log(1.0 - g_x)
    )
    return jnp.where(mask, alpha, 0.0)


def au_pxtau(ce, score, mask, counts, nu, coverage, *, num_bins):
    """The released selective AU loss (``reduction='mean'``), a scalar."""
    alpha = au_weights(score, mask, counts, nu, coverage, num_bins=num_bins)
    return masked_mean(alpha * ce, mask)
