r"""Order statistics without a sort, for the ``'rank'`` equal-mass bins.

The ``'rank'`` rule (``_adaptive.py``) puts a confidence :math:`v` in the
group of its first occurrence in the sorted order, i.e. of
:math:`L(v) = \#\{i : s_i < v\}`. Group :math:`j` starts at rank
:math:`R_j`, so

.. math::

    b(v) = \#\{\, j \in 1..M-1 : L(v) \ge R_j \,\}
         = \#\{\, j \in 1..M-1 : v > s_{(R_j - 1)} \,\},

where :math:`s_{(r)}` is the ``r``-th smallest included confidence
(0-based): at least :math:`R_j` values are below :math:`v` exactly when the
:math:`R_j`-th smallest is. The bins therefore need only the ``M - 1`` order
statistics :math:`s_{(R_j - 1)}`, which a radix select on the float32 bit
patterns gives exactly (non-negative floats order like their bits): three
passes over 11-bit digits, each one scatter-add over the ``N`` rows into
small histograms; no sort, no ``[N, M]`` intermediate.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _conventions

# Three passes over 11-bit digits, most significant first (the first digit
# holds the top 10 bits). Small digits keep the per-pass histograms small
# (2 x 2048 x (M - 1) counts).
_WIDTH = 11
_SHIFTS = (22, 11, 0)


def count_below(x: jax.Array, table: jax.Array) -> jax.Array:
    """``#{r : table[r] < x}`` for each entry of ``x`` (``table`` sorted)."""
    return _conventions.count_edges(x, table, strict=True)


def _pick_digit(counts, local, unroll):
    """Per row of ``counts``, the digit holding rank ``local``.

    The digit is the largest ``x`` with ``S(x) = sum(counts[:x]) <= local``
    (clamped to the last digit), found bit by bit from the top; returns it
    and ``S(x)``, the count of rows in the digits before it.
    """
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
    """The ``ranks``-th smallest of the included ``bits`` (exact, no sort).

    Radix select, most significant digit first: each pass histograms the next
    digit of the rows whose higher digits match a wanted rank's prefix (one
    histogram per distinct prefix; ranks sharing a prefix share it) and picks
    the digit where the rank's cumulative count falls.

    Args:
      bits: uint32 ``[N]`` keys.
      valid: bool ``[N]``; only these rows count.
      ranks: int32 ``[R]``, ascending, each in ``[0, n)`` with ``n`` the
        number of included rows.

    Returns:
      uint32 ``[R]``.

    On the CPU the passes, and the digit search inside a pass, run as loops,
    so XLA compiles each body once: about 0.2 s less compilation on a first
    call at a new shape than unrolled, at the same run time. Elsewhere they
    are unrolled: the TPU compile of the loops accesses about twice the
    bytes (``benchmarks/RESULTS.md``).
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
    """Equal-mass bin of every confidence under the ``'rank'`` rule.

    Same bins as sorting and cutting the sorted values (``_adaptive``), from
    the ``M - 1`` group-start order statistics.

    Args:
      conf: float ``[N]`` confidences in [0, 1] (compared as float32).
      valid: bool ``[N]`` included rows.
      num_bins: static ``M``.

    Returns:
      int32 ``[N]`` in ``[0, M)``; ``-1`` for excluded rows.

    Kernel family ``'metric_radix_select'`` (:mod:`calib_jax.kernels`): the
    plain formulation sorts and cuts (``_adaptive._rank_stats_sort``); float64
    reference ``_sorted_cut_bins`` in ``tests/metrics/test_order_statistics.py``.
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
