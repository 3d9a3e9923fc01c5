r"""CPU drop-ins (:mod:`calib_jax.kernels`) for plain forms of the post-hoc
fits: family ``'posthoc_temperature'``, the temperature-scaling row sums over
blocks of rows with their derivative from the same pass (custom JVPs); family
``'posthoc_order_statistics'``, histogram binning's equal-mass cuts by a radix
select on float32 bit patterns instead of a sort."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Logit entries per block: amortises the loop, keeps the temporaries in cache.
BLOCK_ELEMENTS = 1 << 19


def block_rows(n: int, k: int) -> int:
    """Static number of rows per block for ``[n, k]`` logits."""
    return int(max(1, min(n, BLOCK_ELEMENTS // max(k, 1))))


def exp_sums(z, m, s, *, with_w: bool = False):
    r"""Drop-in for ``_temperature.exp_sums``: :math:`S_n(s)` (and, ``with_w``,
    :math:`W_n(s) = \sum_k e^{s (z_{nk} - m_n)} (z_{nk} - m_n) = S_n'(s)`),
    ``[N]``, a block of rows at a time (the last block shifted back to end at N)."""
    n, k = z.shape
    rows = block_rows(n, k)
    num_blocks = -(-n // rows)
    per_row = jnp.ndim(s) == 1

    def body(i, acc):
        start = jnp.minimum(i * rows, n - rows)
        zb = lax.dynamic_slice_in_dim(z, start, rows, 0)
        mb = lax.dynamic_slice_in_dim(m, start, rows, 0)
        sb = lax.dynamic_slice_in_dim(s, start, rows, 0)[:, None] if per_row else s
        db = zb - mb[:, None]
        e = jnp.exp(sb * db)
        outs = (jnp.sum(e, axis=1),)
        if with_w:
            outs += (jnp.sum(e * db, axis=1),)
        return tuple(
            lax.dynamic_update_slice_in_dim(a, o, start, 0) for a, o in zip(acc, outs)
        )

    # The dtype the plain form returns (s may be wider than z).
    dtype = jnp.result_type(z, m, s)
    init = tuple(jnp.zeros((n,), dtype) for _ in range(2 if with_w else 1))
    out = lax.fori_loop(0, num_blocks, body, init)
    return out if with_w else out[0]


@jax.custom_jvp
def nll_of_log_t(u, z, m, a, w):
    """Drop-in for ``_temperature.nll_of_log_t``, its ``u``-derivative in one pass."""
    s = jnp.exp(-u)
    return jnp.sum(w * (jnp.log(exp_sums(z, m, s)) + s * a))


@nll_of_log_t.defjvp
def _nll_of_log_t_jvp(primals, tangents):
    u, z, m, a, w = primals
    s = jnp.exp(-u)
    big_s, big_w = exp_sums(z, m, s, with_w=True)
    value = jnp.sum(w * (jnp.log(big_s) + s * a))
    # d/du_n of the row-n term: -s_n w_n (W_n / S_n + m_n - z_ny).
    slope = -s * w * (big_w / big_s + a)
    return value, jnp.sum(slope * tangents[0])


@jax.custom_jvp
def top_confidence_of_log_t(u, z, m):
    """Drop-in for ``_temperature.top_confidence_of_log_t`` (``u``-derivative too)."""
    return 1.0 / exp_sums(z, m, jnp.exp(-u))


@top_confidence_of_log_t.defjvp
def _top_confidence_of_log_t_jvp(primals, tangents):
    u, z, m = primals
    s = jnp.exp(-u)
    big_s, big_w = exp_sums(z, m, s, with_w=True)
    c = 1.0 / big_s
    # dc_n/du = -(dS_n/ds)(ds/du) / S_n^2 = s W_n c_n^2.
    return c, s * big_w * c * c * tangents[0]


def grouped_cut(v, group, *, num_groups, ranks, top_label_of=0):
    """Drop-in for ``_reduction.grouped_cut`` by :func:`grouped_order_statistics`
    on uint32 keys ordering like the scores. Top-label confidences of
    ``top_label_of = K`` classes lie in [fl(1/K), 1], so their keys take fewer
    bits. Values of empty groups are unspecified."""
    bits = lax.bitcast_convert_type(v.astype(jnp.float32) + 0.0, jnp.uint32)
    if top_label_of:
        one_over_k = np.float32(1.0) / np.float32(top_label_of)
        low = max(int(one_over_k.view(np.uint32)) - 4096, 0)
        high = int(np.float32(1.0).view(np.uint32))
        key_bits = max(1, (high - low).bit_length())
        # Scores outside [low, high] (only NaN rows, which the value check
        # rejects) are clipped so the keys stay in range.
        keys = jnp.clip(bits, np.uint32(low), np.uint32(high)) - np.uint32(low)
    else:
        low, key_bits, keys = 0, 32, bits
    values, count_le, sizes = grouped_order_statistics(
        keys, group, ranks, num_groups=num_groups, key_bits=key_bits
    )
    values = lax.bitcast_convert_type(values + np.uint32(low), jnp.float32)
    return values, count_le, sizes


def _widths(num_slots: int, key_bits: int = 32) -> tuple[int, ...]:
    # Wide digits: few passes; narrow ones (many slots): small histograms.
    if key_bits == 32:
        return (11, 11, 10) if num_slots <= 1024 else (8, 8, 8, 8)
    widest = 13 if num_slots <= 256 else 11 if num_slots <= 1024 else 8
    passes = -(-key_bits // widest)
    base, extra = divmod(key_bits, passes)
    return tuple(base + (i < extra) for i in range(passes))


def grouped_order_statistics(
    bits: jax.Array,
    group: jax.Array,
    ranks,
    *,
    num_groups: int | None = None,
    key_bits: int = 32,
):
    """``(values, count_le, sizes)``: the ``ranks[g, r]``-th smallest uint32
    ``bits`` of group ``g`` ``[G, R]``, the group's rows ``<=`` each ``[G, R]``
    and the group sizes ``[G]``, by a most-significant-digit-first radix select.

    ``group`` is in ``[0, G]`` (``G`` excludes the row); ``ranks`` int32 ``[G,
    R]`` ascending, each below its group's size, or a function of the sizes
    returning them (then give ``num_groups``); keys are below ``2**key_bits``.
    """
    if callable(ranks):
        g_count, rank_fn = num_groups, ranks
        r_count = jax.eval_shape(
            rank_fn, jax.ShapeDtypeStruct((g_count,), jnp.int32)
        ).shape[1]
    else:
        g_count, r_count = ranks.shape
        rank_fn = None
    slots = g_count * r_count
    m = bits.shape[0]
    ones = jnp.ones((m,), jnp.int32)
    rank_group = jnp.arange(g_count, dtype=jnp.int32)[:, None]
    prefix = jnp.zeros((g_count, r_count), jnp.uint32)
    sizes = None
    widths = _widths(slots, key_bits)
    shift = key_bits
    row_slot = None  # slot of each row after the previous pass (slots = none)
    rank_slot = None  # slot of each rank after the previous pass
    for i, width in enumerate(widths):
        shift -= width
        size = 1 << width
        digit = ((bits >> shift) & (size - 1)).astype(jnp.int32)
        if i == 0:
            seg = jnp.where(group < g_count, group * size + digit, g_count * size)
            hist = jax.ops.segment_sum(ones, seg, g_count * size + 1)
            hist = hist[: g_count * size].reshape(g_count, size)
            sizes = jnp.sum(hist, axis=1)
            if rank_fn is not None:
                ranks = rank_fn(sizes)
            local = ranks.astype(jnp.int32)
            counts = jnp.broadcast_to(hist[:, None, :], (g_count, r_count, size))
        else:
            seg = jnp.where(row_slot < slots, row_slot * size + digit, slots * size)
            hist = jax.ops.segment_sum(ones, seg, slots * size + 1)
            hist = hist[: slots * size].reshape(slots, size)
            counts = hist[rank_slot]
        cum = jnp.cumsum(counts, axis=-1)
        chosen = jnp.sum((cum <= local[..., None]).astype(jnp.int32), axis=-1)
        chosen = jnp.minimum(chosen, size - 1)
        at_cum, at_count = (
            jnp.take_along_axis(a, chosen[..., None], axis=-1)[..., 0]
            for a in (cum, counts)
        )
        local = local - (at_cum - at_count)
        prefix = (prefix << width) | chosen.astype(jnp.uint32)
        if i == len(widths) - 1:
            # ``local`` is now the rank among the rows equal to the value, and
            # the chosen digit's count is the number of those rows.
            count_le = ranks.astype(jnp.int32) - local + at_count
            break
        # Ranks ascend, so equal prefixes are adjacent: a rank's slot is its
        # group's first rank with the same prefix.
        first = jax.vmap(lambda p: jnp.searchsorted(p, p, side="left"))(prefix)
        new_slot = (rank_group * r_count + first).astype(jnp.int32)
        if i == 0:
            parent = rank_group * size + chosen
            table = jnp.full((g_count * size,), slots, jnp.int32)
            row_in = group < g_count
            row_parent = group * size + digit
        else:
            parent = rank_slot * size + chosen
            table = jnp.full((slots * size,), slots, jnp.int32)
            row_in = row_slot < slots
            row_parent = row_slot * size + digit
        table = table.at[parent.reshape(-1)].set(new_slot.reshape(-1))
        # A row already out of every slot stays out: it is masked, not given
        # an index (a negative one would wrap to the table's last entry).
        row_slot = jnp.where(row_in, table[jnp.where(row_in, row_parent, 0)], slots)
        rank_slot = new_slot
    return prefix, count_le, sizes
