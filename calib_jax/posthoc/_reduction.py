r"""The top-label and one-vs-rest multiclass-to-binary reductions (Gupta &
Ramdas 2022, arXiv:2107.08353v3, Sec. 4) of histogram binning and isotonic
regression, and exact per-group order statistics. Conventions: ``docs/posthoc.md``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.posthoc import _cpu_kernels, _validate

VARIANTS = ("top_label", "one_vs_rest")


# Fitting and applying a map both compute the scores with these jitted
# functions, so equal logits give bit-equal scores (an enclosing jit may fuse).


@jax.jit
def probabilities(logits: jax.Array) -> jax.Array:
    """Softmax probabilities ``[N, K]`` (float32 or wider)."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return jax.nn.softmax(logits, axis=-1)


@jax.jit
def top_label(logits: jax.Array):
    """``(pred [N], conf [N])``: the first arg-max and the top-label
    confidence :math:`1 / \\sum_k e^{z_k - \\max z}`."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    m = jnp.max(logits, axis=-1, keepdims=True)
    pred = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return pred, 1.0 / jnp.sum(jnp.exp(logits - m), axis=-1)


@jax.jit
def checked_top_label(logits: jax.Array, labels: jax.Array, where):
    """``(top_label(logits), value_summary)`` from one read of the logits."""
    return top_label(logits), _validate.value_summary(logits, labels, where)


@jax.jit
def checked_probabilities(logits: jax.Array, labels: jax.Array, where):
    """``(probabilities(logits), value_summary)`` from one read of the logits."""
    return probabilities(logits), _validate.value_summary(logits, labels, where)


def top_label_output(logp: jax.Array, pred: jax.Array, conf: jax.Array):
    """``logp [N, K]`` with ``log conf [N]`` at ``pred [N]``; the other classes
    share ``1 - conf`` in proportion to their probabilities (evenly if all 0)."""
    k = logp.shape[-1]
    hit = jnp.arange(k, dtype=jnp.int32)[None, :] == pred[:, None]
    rest = jax.nn.logsumexp(jnp.where(hit, -jnp.inf, logp), axis=-1)  # log(1 - c)
    log_c = jnp.log(conf)
    log_rest = jnp.log1p(-conf)
    finite = jnp.isfinite(rest)
    shift = jnp.where(finite, log_rest - jnp.where(finite, rest, 0.0), 0.0)
    even = log_rest - math.log(max(k - 1, 1))
    other = jnp.where(finite[:, None], logp + shift[:, None], even[:, None])
    return jnp.where(hit, log_c[:, None], other)


def one_vs_rest_output(q: jax.Array) -> jax.Array:
    """``log(q / sum(q))`` per row (zeros, i.e. uniform, where the sum is 0)."""
    total = jnp.sum(q, axis=-1, keepdims=True)
    ok = total > 0
    out = jnp.log(q) - jnp.log(jnp.where(ok, total, 1.0))
    return jnp.where(ok, out, jnp.zeros_like(out))


def apply_top_label(binary_map, params, logits: jax.Array) -> jax.Array:
    """Top-label log-probabilities; ``binary_map(params, conf, pred)`` gives
    each row's calibrated confidence."""
    pred, conf = top_label(logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return top_label_output(logp, pred, binary_map(params, conf, pred))


def apply_one_vs_rest(binary_map, params, logits: jax.Array) -> jax.Array:
    """One-vs-rest log-probabilities: ``binary_map`` of every class's
    probability, renormalised."""
    n, k = logits.shape
    p = probabilities(logits)
    cls = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :], (n, k))
    return one_vs_rest_output(binary_map(params, p, cls))


@kernels.dispatch("posthoc_order_statistics", _cpu_kernels.grouped_cut)
def grouped_cut(v, group, *, num_groups: int, ranks, top_label_of: int = 0):
    """The ``ranks(n)[g, r]``-th smallest scores ``v`` of each group ``g``.

    One sort of the (group, score) pairs; exact for any scores, ties included.

    Args:
      v: float ``[M]`` scores in ``[0, 1]``.
      group: int32 ``[M]`` group of each row in ``[0, G]``; ``G`` excludes
        the row.
      num_groups: static ``G``.
      ranks: static function of the group sizes (int32 ``[G]``) returning
        int32 ``[G, R]`` ranks, ascending along ``R``, each in ``[0, n_g)``.
      top_label_of: static; ``K`` when ``v`` are top-label confidences of
        ``K`` classes (at least ``fl(1/K)``), else 0 (used by the CPU kernel).

    Returns:
      ``(values, count_le, sizes)``: float32 ``[G, R]`` order statistics
      (unspecified for an empty group), int32 ``[G, R]`` numbers of the
      group's rows ``<=`` each of them, and the int32 ``[G]`` group sizes.
    """
    del top_label_of
    m = v.shape[0]
    g, s = lax.sort((group.astype(jnp.int32), v.astype(jnp.float32) + 0.0), num_keys=2)
    starts = jnp.searchsorted(g, jnp.arange(num_groups + 1, dtype=jnp.int32))
    starts = starts.astype(jnp.int32)
    sizes = starts[1:] - starts[:-1]
    idx = jnp.clip(starts[:-1, None] + ranks(sizes), 0, m - 1)
    last = jnp.concatenate([(g[1:] != g[:-1]) | (s[1:] != s[:-1]), jnp.array([True])])
    iota = jnp.arange(m, dtype=jnp.int32)
    end = lax.cummin(jnp.where(last, iota, m), reverse=True)[idx]
    count_le = jnp.where(sizes[:, None] > 0, end + 1 - starts[:-1, None], 0)
    return s[idx], count_le, sizes


def cut_ranks(sizes: jax.Array, *, num_bins: int, midpoint: bool) -> jax.Array:
    """:func:`equal_mass_ranks`, each followed by the next rank (clipped to
    the group) with ``midpoint``: ``[G, M-1]`` or ``[G, 2(M-1)]``."""
    ranks = equal_mass_ranks(sizes, num_bins)
    if not midpoint:
        return ranks
    top = jnp.maximum(sizes.astype(jnp.int32) - 1, 0)[:, None]
    pairs = jnp.stack([ranks, jnp.minimum(ranks + 1, top)], axis=-1)
    return pairs.reshape(ranks.shape[0], -1)


def equal_mass_ranks(sizes: jax.Array, num_bins: int) -> jax.Array:
    r"""Ranks ``[G, M-1]`` of the last value of each of the first ``M - 1``
    equal-mass groups of a sorted group (the first :math:`n \bmod M` one
    longer, as :func:`calib_jax.metrics.adaptive_ece`'s ``'rank'`` rule)."""
    n = sizes.astype(jnp.int32)[:, None]
    q, rem = n // num_bins, n % num_bins
    j = jnp.arange(1, num_bins, dtype=jnp.int32)[None, :]
    start = jnp.where(j <= rem, j * (q + 1), rem * (q + 1) + (j - rem) * q)
    return jnp.clip(start - 1, 0, jnp.maximum(n - 1, 0))


def float_bits(x: jax.Array) -> jax.Array:
    """uint32 bit patterns of float32 ``x >= 0`` (``-0.0`` becomes ``+0.0``)."""
    return lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.uint32)


def segmented_searchsorted(
    table: jax.Array, row: jax.Array, v: jax.Array, *, side: str = "right"
) -> jax.Array:
    """int32 ``searchsorted(table[row[i]], v[i], side)`` for every ``i``, in
    ``[0, L]``: a binary search over the sorted rows of ``table [G, L]``."""
    length = table.shape[1]
    flat = table.reshape(-1)
    base = row.astype(jnp.int32) * length
    lo = jnp.zeros(v.shape, jnp.int32)
    hi = jnp.full(v.shape, length, jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(length + 1)))):
        mid = (lo + hi) // 2
        value = flat[base + jnp.minimum(mid, length - 1)]
        below = (value <= v) if side == "right" else (value < v)
        right = (mid < hi) & below
        lo = jnp.where(right, mid + 1, lo)
        hi = jnp.where(right, hi, mid)
    return lo
