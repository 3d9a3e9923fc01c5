r"""Exact order statistics without a sort (radix select on the float32 bits), for
the ``'rank'`` equal-mass bins of ``_adaptive.py``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _conventions

# Three passes over 11-bit digits (small histograms), most significant first.
_WIDTH = 11
_SHIFTS = (22, 11, 0)


def count_below(x: jax.Array, table: jax.Array) -> jax.Array:
    """``#{r : table[r] < x}`` for each entry of ``x`` (``table`` sorted)."""
    return _conventions.count_edges(x, table, strict=True)


def _pick_digit(counts, local, unroll):
    """Per row of ``counts``, ``(x, S(x))``: the largest digit ``x`` with
    ``S(x) = sum(counts[:x]) <= local`` (clamped to the last), bit by bit."""
    r, size = counts.shape
    digits = lax.broadcasted_iota(jnp.int32, (r, size), 1)

    def step(i, carry):
        chosen, before = carry
        cand = chosen | (1 << (_WIDTH - 1 - i))
        below = jnp.sum(jnp.where(digits < cand[:, None], counts, 0), axis=1)
        ok = below <= local
        return jnp.where(ok, cand, chosen), jnp.where(ok, below, before)

    zeros = jnp.zeros((r,), jnp.int32)
    return lax.fori_loop(0, _WIDTH, step, (zeros, zeros), unroll=unroll)


def order_statistics(bits: jax.Array, valid: jax.Array, ranks: jax.Array) -> jax.Array:
    """uint32 ``[R]``: the ``ranks``-th smallest of the ``valid`` uint32 ``bits``.

    ``ranks``: int32 ``[R]``, ascending, in ``[0, n)``. Radix select: each pass
    histograms the next digit of the rows matching a wanted rank's prefix.
    """
    return lax.platform_dependent(
        bits,
        valid,
        ranks,
        cpu=functools.partial(_radix_select, unroll=1),
        default=functools.partial(_radix_select, unroll=True),
    )


def _radix_select(bits, valid, ranks, *, unroll):
    """:func:`order_statistics`, its loops rolled (1) or unrolled (True)."""
    r = ranks.shape[0]
    size = 1 << _WIDTH
    ones = jnp.ones(bits.shape, jnp.int32)

    def one_pass(carry, shift):
        prefix, local = carry  # digits chosen so far; rank among their rows
        shifted = bits >> shift.astype(jnp.uint32)
        digit = (shifted & (size - 1)).astype(jnp.int32)
        high = shifted >> _WIDTH  # 0 in the first pass, as the empty prefix
        # Ranks ascend, so prefixes do: a row's group is the first rank whose
        # prefix is not below the row's high digits.
        row_group = jnp.minimum(count_below(high, prefix), r - 1)
        member = valid & (prefix[row_group] == high)
        seg = jnp.where(member, row_group * size + digit, r * size)
        hist = jax.ops.segment_sum(ones, seg, r * size).reshape(r, size)
        group = jnp.sum(prefix[None, :] < prefix[:, None], axis=1)  # first equal
        chosen, before = _pick_digit(hist[group], local, unroll)
        prefix = (prefix << _WIDTH) | chosen.astype(jnp.uint32)
        return (prefix, local - before), None

    init = (jnp.zeros((r,), jnp.uint32), ranks)
    (prefix, _), _ = lax.scan(
        one_pass, init, jnp.array(_SHIFTS, jnp.int32), unroll=unroll
    )
    return prefix


def rank_bins(conf: jax.Array, valid: jax.Array, num_bins: int) -> jax.Array:
    r"""Equal-mass bin of every confidence under the ``'rank'`` rule.

    The bins of sorting and cutting (``_adaptive``), exactly: a value :math:`v`
    is in bin :math:`\#\{j \in 1..M-1 : v > s_{(R_j - 1)}\}`, :math:`R_j` the
    start rank of group :math:`j`, :math:`s_{(r)}` the ``r``-th smallest
    (selected on the bits: non-negative floats order like their bits).
    Returns int32 ``[N]`` in ``[0, M)``, ``-1`` for excluded rows.

    Kernel family ``'metric_radix_select'`` (plain form ``_adaptive.rank_stats``).
    """
    m = num_bins
    bits = lax.bitcast_convert_type(conf.astype(jnp.float32) + 0.0, jnp.uint32)
    if m == 1:
        return jnp.where(valid, 0, -1)
    n = jnp.sum(valid.astype(jnp.int32))
    q, rem = n // m, n % m
    j = jnp.arange(1, m, dtype=jnp.int32)
    start = jnp.where(j <= rem, j * (q + 1), rem * (q + 1) + (j - rem) * q)
    ranks = jnp.clip(start - 1, 0, jnp.maximum(n - 1, 0))
    thresholds = order_statistics(bits, valid, ranks)
    return jnp.where(valid, count_below(bits, thresholds), -1)
