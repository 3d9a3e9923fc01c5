"""CPU-tuned drop-ins of the metric kernels: each computes what the plain
function it names computes (up to float32 summation order) and is chosen by
:func:`calib_jax.kernels.dispatch` (``calib_jax.kernels.FAMILIES``)."""

from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _conventions, _kernels, _order_statistics

# Rows wider than this are viewed as [N * K / g, g] blocks, g the largest
# divisor of K in [_MIN_GROUP, _MAX_GROUP] (XLA:CPU vectorises short rows).
_MAX_GROUP = 32
_MIN_GROUP = 8
# Elements per scan step of the class-wise accumulation.
CLASSWISE_BLOCK = 1 << 18


def _group_size(k: int, ways: int = 1) -> int:
    """Classes per block of :func:`top_label`: K up to 32, else the largest
    divisor ``g`` of K in [8, 32] with ``K / g`` a multiple of ``ways``, else K."""
    if k > _MAX_GROUP:
        for g in range(_MAX_GROUP, _MIN_GROUP - 1, -1):
            if k % g == 0 and (k // g) % ways == 0:
                return g
    return k


def class_ways(k: int) -> int:
    """``gcd(K, jax.device_count())``: the blocks below stay aligned with any
    even split of the classes over the devices (a traced array's sharding is
    not visible at trace time)."""
    return math.gcd(k, jax.device_count())


def _screen_values(probs):
    """``_common.screen_values`` (which imports this module)."""
    big = jnp.asarray(2.0 ** (jnp.finfo(probs.dtype).maxexp - 1), probs.dtype)
    return probs + (jnp.abs(probs) - probs) * big


def _row_sums(x):
    """Row sums of a ``[rows, K]`` block by column adds (K <= 32) or a
    matrix-vector product: XLA:CPU does not vectorise ``jnp.sum(x, axis=1)``."""
    k = x.shape[1]
    if k <= _MAX_GROUP:
        return functools.reduce(operator.add, [x[:, j] for j in range(k)])
    return x @ jnp.ones((k,), x.dtype)


def _packed_max(probs, labels, offset, screen):
    """Row max of uint32 ``4 bits(p) + 2 [k < y] + [k = y]`` (and with
    ``screen`` the row sums of ``screen_values``, same reduction)."""
    bits = lax.bitcast_convert_type(probs, jnp.uint32)
    k = lax.broadcasted_iota(jnp.int32, probs.shape, 1) + offset[:, None]
    y = labels[:, None]
    key = bits * 4 + 2 * (k < y).astype(jnp.uint32) + (k == y).astype(jnp.uint32)
    if not screen:
        return jnp.max(key, axis=1)
    screened = _screen_values(probs)
    zero = (jnp.zeros((), jnp.uint32), jnp.zeros((), probs.dtype))
    return lax.reduce(
        (key, screened),
        zero,
        lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]),
        (1,),
    )


def _top_label_blocks(probs, labels, screen, group):
    """The packed-key max over ``[N * K / group, group]`` blocks, then the
    block maxima (``group = K``: one reduction over the row)."""
    n, k = probs.shape
    blocks = k // group
    shape = (n, blocks)
    # Broadcasts (not repeat/tile) so XLA fuses them into the reduction.
    offset = jnp.broadcast_to(jnp.arange(blocks, dtype=jnp.int32) * group, shape)
    sub_labels = jnp.broadcast_to(labels[:, None], shape).reshape(-1)
    sub = probs.reshape(n * blocks, group)
    key = _packed_max(sub, sub_labels, offset.reshape(-1), screen)
    if screen:
        key, sums = key
        sums = jnp.sum(sums.reshape(shape), axis=1)
    key = jnp.max(key.reshape(shape), axis=1)
    return _unpack(key, sums if screen else None)


def _unpack(key, sums):
    """``(conf, correct[, sums])`` from the row maxima of the packed keys."""
    out = (lax.bitcast_convert_type(key >> 2, jnp.float32), (key & 3) == 1)
    return out if sums is None else (*out, sums)


def _top_label_grouped(probs, labels, screen, group):
    """:func:`_top_label_blocks` (bit for bit) on the ``[N, K / group, group]``
    view, so a class-sharded ``probs`` splits along the block axis. The
    barrier keeps XLA:CPU from fusing the two reductions (much slower)."""
    n, k = probs.shape
    sub = probs.reshape(n, k // group, group)
    cls = lax.broadcasted_iota(jnp.int32, sub.shape, 1) * group
    cls = cls + lax.broadcasted_iota(jnp.int32, sub.shape, 2)
    y = labels[:, None, None]
    bits = lax.bitcast_convert_type(sub, jnp.uint32)
    key = bits * 4 + 2 * (cls < y).astype(jnp.uint32) + (cls == y).astype(jnp.uint32)
    if screen:
        zero = (jnp.zeros((), jnp.uint32), jnp.zeros((), sub.dtype))
        key, sums = lax.reduce(
            (key, _screen_values(sub)),
            zero,
            lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]),
            (2,),
        )
        key, sums = lax.optimization_barrier((key, sums))
        return _unpack(jnp.max(key, axis=1), jnp.sum(sums, axis=1))
    key = lax.optimization_barrier(jnp.max(key, axis=2))
    return _unpack(jnp.max(key, axis=1), None)


def top_label(probs, labels, *, screen=False):
    """Drop-in for ``_common.top_label_plain`` (float32): one max-reduction
    over packed keys. For ``0 <= p < 2`` the float32 bits are monotone and
    ``4 bits`` fits in 32 bits, so the largest key holds the confidence
    (``key >> 2``) and its flag is 1 exactly when the label is the first
    maximal class. Wide rows go in blocks on the CPU only (a TPU's reshape
    reads 16x the bytes)."""
    k = probs.shape[1]
    group = _group_size(k, class_ways(k))

    def blocked(p, y):
        return _top_label_grouped(p, y, screen, group)

    def whole(p, y):
        return _top_label_blocks(p, y, screen, k)

    if group == k:
        return whole(probs, labels)
    return lax.platform_dependent(probs, labels, cpu=blocked, default=whole)


def sort_key(conf, flag, valid):
    """int32 ``2 bits(conf) + flag`` (monotone for ``0 <= conf < 2``);
    excluded rows get the largest key."""
    bits = lax.bitcast_convert_type(conf.astype(jnp.float32) + 0.0, jnp.int32)
    key = bits * 2 + flag.astype(jnp.int32)
    return jnp.where(valid, key, jnp.iinfo(jnp.int32).max)


def sorted_by_confidence(conf, flag, valid):
    """Drop-in for ``_common.sorted_by_confidence``: one sort of the int32
    keys of :func:`sort_key`, no payload."""
    key = jnp.sort(sort_key(conf, flag, valid))
    return lax.bitcast_convert_type(key >> 1, jnp.float32), key & 1


def sortable_int(x):
    """int32 keys ordered like the (non-NaN) float32 values ``x``."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def ood_ranks(s_in, s_out, v_out):
    """Drop-in for ``_ood.ranks``: the sort on int32 keys."""
    top = jnp.iinfo(jnp.int32).max
    ref = jnp.sort(jnp.where(v_out, sortable_int(s_out), top))
    query = sortable_int(s_in)
    return (
        jnp.searchsorted(ref, query, side="left"),
        jnp.searchsorted(ref, query, side="right"),
    )


def ood_accepted(s_in, s_out, v_in, v_out, position):
    """Drop-in for ``_ood.accepted``: the sort on int32 keys."""
    low = jnp.iinfo(jnp.int32).min
    keys = jnp.sort(jnp.where(v_in, sortable_int(s_in), low))
    return v_out & (sortable_int(s_out) >= keys[position])


def _correct_counts(probs, labels, valid, num_bins, convention, slots):
    """Per-class per-bin correct counts ``[K * S]``: one scatter of N ones
    (only the label entry of a row is correct)."""
    k = probs.shape[1]
    lab = labels.astype(jnp.int32)
    p_label = jnp.take_along_axis(probs, lab[:, None], axis=1)[:, 0]
    lab_bins = _conventions.bin_index(p_label, num_bins, convention)
    seg = jnp.where(valid & (lab_bins >= 0), lab * slots + lab_bins, k * slots)
    return jax.ops.segment_sum(jnp.ones(lab.shape, jnp.int32), seg, k * slots)


def _class_bin_sums(val, bins, keep, slots, by_class):
    """Per-class per-slot sums ``[K, slots]`` of ``val`` ``[rows, K]`` where
    ``keep``, by one scatter-add; ``by_class`` makes the class a batch
    dimension of the scatter (same sums bit for bit), which the SPMD
    partitioner splits along a sharded class axis."""
    k = val.shape[1]
    if by_class:
        dims = lax.ScatterDimensionNumbers(
            update_window_dims=(),
            inserted_window_dims=(1,),
            scatter_dims_to_operand_dims=(1,),
            operand_batching_dims=(0,),
            scatter_indices_batching_dims=(1,),
        )
        seg = jnp.where(keep, bins, slots)[..., None]
        zeros = jnp.zeros((k, slots), val.dtype)
        return lax.scatter_add(
            zeros, seg, val, dims, mode=lax.GatherScatterMode.FILL_OR_DROP
        )
    cls = lax.broadcasted_iota(jnp.int32, val.shape, 1)
    seg = jnp.where(keep, cls * slots + bins, k * slots)
    s = jax.ops.segment_sum(val.reshape(-1), seg.reshape(-1), k * slots)
    return s.reshape(k, slots)


def accumulate_classwise(probs, labels, valid, *, num_bins, convention, screen=False):
    """Drop-in for ``_binned_stats.accumulate_classwise``: scatter-adds in a
    ``lax.scan`` over row blocks. Bin 0, where most softmax entries fall, is
    not scattered but derived from the column totals (unless the convention
    drops exact zeros)."""
    n, k = probs.shape
    slots = _conventions.num_slots(convention, num_bins)
    derive_first = not (convention.side == "right" and convention.zero == "drop")
    by_class = class_ways(k) > 1
    chains = math.gcd(n, jax.device_count())
    accumulate = functools.partial(
        _classwise_chain,
        num_bins=num_bins,
        convention=convention,
        lowest=1 if derive_first else 0,
        by_class=by_class,
        screen=screen,
    )
    if chains == 1:
        count, sum_conf, col_sum, sums = accumulate(probs, valid)
    else:
        # Independent scans over ``chains`` contiguous row ranges (a batch
        # dimension the partitioner splits along sharded rows), then added.
        parts = jax.vmap(accumulate)(
            probs.reshape(chains, n // chains, k), valid.reshape(chains, -1)
        )
        count, sum_conf, col_sum = (jnp.sum(a, axis=0) for a in parts[:3])
        sums = None if parts[3] is None else parts[3].reshape(-1)
    if derive_first:
        n_valid = jnp.sum(valid.astype(jnp.int32))
        count = count.at[:, 0].set(n_valid - jnp.sum(count, axis=1))
        sum_conf = sum_conf.at[:, 0].set(col_sum - jnp.sum(sum_conf, axis=1))
    n_correct = _correct_counts(probs, labels, valid, num_bins, convention, slots)
    out = (count, sum_conf, n_correct.reshape(k, slots))
    return (*out, sums) if screen else out


def _classwise_chain(probs, valid, *, num_bins, convention, lowest, by_class, screen):
    """Per-class per-slot ``(count, sum conf, column totals, row sums)`` of
    the bins ``>= lowest`` of ``probs`` ``[n, K]`` (row sums None without
    ``screen``)."""
    n, k = probs.shape
    slots = _conventions.num_slots(convention, num_bins)
    rows = max(1, min(n, CLASSWISE_BLOCK // k))

    def block(p, v):
        bins = _conventions.bin_index(p, num_bins, convention)
        keep = v[:, None] & (bins >= lowest)
        val = lax.complex(p, jnp.ones_like(p))
        s = _class_bin_sums(val, bins, keep, slots, by_class)
        # Column totals of the included rows (excluded rows may hold NaN).
        col = v.astype(p.dtype) @ jnp.where(v[:, None], p, 0.0)
        sums = _row_sums(_screen_values(p)) if screen else None
        return (jnp.imag(s).astype(jnp.int32), jnp.real(s), col), sums

    count = jnp.zeros((k, slots), jnp.int32)
    sum_conf = jnp.zeros((k, slots), probs.dtype)
    col_sum = jnp.zeros((k,), probs.dtype)
    full = n // rows
    sums = []
    if full:

        def body(carry, j):
            p = lax.dynamic_slice_in_dim(probs, j * rows, rows, 0)
            v = lax.dynamic_slice_in_dim(valid, j * rows, rows, 0)
            part, row_sums = block(p, v)
            return tuple(a + b for a, b in zip(carry, part)), row_sums

        init = (count, sum_conf, col_sum)
        carry, row_sums = lax.scan(body, init, jnp.arange(full))
        count, sum_conf, col_sum = carry
        sums.append(row_sums)
    if n - full * rows:
        (c, s, col), row_sums = block(probs[full * rows :], valid[full * rows :])
        count, sum_conf, col_sum = count + c, sum_conf + s, col_sum + col
        sums.append(row_sums)
    sums = jnp.concatenate([r.reshape(-1) for r in sums]) if screen else None
    return count, sum_conf, col_sum, sums


def rank_stats(conf, correct, valid, *, num_bins):
    """Drop-in for ``_adaptive.rank_stats``: the ``'rank'`` bins by radix
    select (``_order_statistics.rank_bins``), no sort."""
    conf = conf.astype(jnp.float32) + 0.0  # the values the sort path bins
    bins = _order_statistics.rank_bins(conf, valid, num_bins)
    count, sum_conf, sum_correct = _kernels.accumulate_top_label(
        conf, correct, bins, valid, num_bins
    )
    return count, sum_conf, sum_correct, jnp.sum(valid.astype(jnp.int32))
