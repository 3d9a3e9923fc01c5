r"""Accumulation kernels of :class:`~calib_jax.metrics.BinnedStats`.

Both turn one batch into per-bin sums with scatter-adds over ``[N]`` (top
label) or blocks of ``[rows, K]`` (class-wise) values; neither tuned kernel
materialises an ``[N, bins]`` or ``[N, K]`` intermediate. Each keeps a plain
formulation (``*_plain``); :mod:`calib_jax.kernels` picks one per platform.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.metrics import _common, _conventions

# Rows per accumulation block. A block's per-bin count and correct count are
# packed into one float32 as count * 4096 + correct (exact below 2**24).
_BLOCK = 2048
_PACK = 4096.0
# Elements per scan step of the class-wise accumulation.
_CLASSWISE_BLOCK = 1 << 18


def _in_range(bins, valid, slots):
    """The accumulator of every row, ``slots`` (dropped) when it has none."""
    return jnp.where(valid & (bins >= 0) & (bins < slots), bins, slots)


def accumulate_top_label(conf, correct, bins, valid, slots):
    """Top-label per-bin ``(count, sum conf, sum correct)``, each ``[slots]``.

    Kernel family ``'metric_scatter'`` (:mod:`calib_jax.kernels`): tuned
    :func:`_accumulate_packed`, plain :func:`accumulate_top_label_plain`;
    float64 reference ``tests/_reference_metrics.py``.
    """
    return kernels.select(
        "metric_scatter",
        functools.partial(_accumulate_packed, slots=slots),
        functools.partial(accumulate_top_label_plain, slots=slots),
        conf,
        correct,
        bins,
        valid,
    )


def accumulate_top_label_plain(conf, correct, bins, valid, *, slots):
    """Plain :func:`accumulate_top_label`: one ``.at[bin].add`` per statistic."""
    seg = _in_range(bins, valid, slots)
    count = jnp.zeros((slots,), jnp.int32).at[seg].add(1, mode="drop")
    sum_conf = jnp.zeros((slots,), conf.dtype).at[seg].add(conf, mode="drop")
    n_correct = (
        jnp.zeros((slots,), jnp.int32)
        .at[seg]
        .add(correct.astype(jnp.int32), mode="drop")
    )
    return count, sum_conf, n_correct


def _accumulate_packed(conf, correct, bins, valid, *, slots):
    """Top-label per-bin (count, sum conf, sum correct) with one scatter-add.

    Each row adds ``conf + i * (4096 + correct)`` (a complex number) to the
    accumulator of its (block, bin, lane); lanes (row index mod 8) break the
    store-to-load chains of consecutive rows hitting the same bin.
    """
    n = conf.shape[0]
    lanes = 8 if slots <= 64 else 1
    blocks = -(-n // _BLOCK)
    size = blocks * slots * lanes
    i = lax.iota(jnp.int32, n)
    seg = ((i // _BLOCK) * slots + bins) * lanes + (i % lanes)
    seg = jnp.where(valid & (bins >= 0) & (bins < slots), seg, size)
    packed = _PACK + correct.astype(conf.dtype)
    sums = jax.ops.segment_sum(lax.complex(conf, packed), seg, size)
    sums = jnp.sum(sums.reshape(blocks, slots, lanes), axis=2)
    high = jnp.floor(jnp.imag(sums) * (1.0 / _PACK))
    count = jnp.sum(high.astype(jnp.int32), axis=0)
    n_correct = jnp.sum((jnp.imag(sums) - _PACK * high).astype(jnp.int32), axis=0)
    return count, jnp.sum(jnp.real(sums), axis=0), n_correct


def gap_sums_top_label(conf, correct, bins, valid, slots):
    """Per-bin ``sum(conf - correct)``, ``[slots]`` (ECE fast path).

    For ``p = 1`` with only empty bins skipped, ECE needs nothing else:
    ``sum_b |sum_{i in b} (c_i - a_i)| / N``. Kernel family
    ``'metric_scatter'``: tuned :func:`_gap_sums_blocked`, plain
    :func:`gap_sums_top_label_plain`.
    """
    return kernels.select(
        "metric_scatter",
        functools.partial(_gap_sums_blocked, slots=slots),
        functools.partial(gap_sums_top_label_plain, slots=slots),
        conf,
        correct,
        bins,
        valid,
    )


def gap_sums_top_label_plain(conf, correct, bins, valid, *, slots):
    """Plain :func:`gap_sums_top_label`: one ``.at[bin].add``."""
    gap = conf - correct.astype(conf.dtype)
    seg = _in_range(bins, valid, slots)
    return jnp.zeros((slots,), conf.dtype).at[seg].add(gap, mode="drop")


def _gap_sums_blocked(conf, correct, bins, valid, *, slots):
    """:func:`gap_sums_top_label` with one float scatter-add in row blocks and
    lanes: half the bytes of :func:`_accumulate_packed` per row."""
    n = conf.shape[0]
    lanes = 8 if slots <= 64 else 1
    blocks = -(-n // _BLOCK)
    size = blocks * slots * lanes
    i = lax.iota(jnp.int32, n)
    seg = ((i // _BLOCK) * slots + bins) * lanes + (i % lanes)
    seg = jnp.where(valid & (bins >= 0) & (bins < slots), seg, size)
    gap = conf - correct.astype(conf.dtype)
    sums = jax.ops.segment_sum(gap, seg, size)
    return jnp.sum(sums.reshape(blocks, slots, lanes), axis=(0, 2))


def accumulate_classwise(probs, labels, valid, num_bins, convention):
    """Per-class per-bin ``(count, sum conf, sum correct)``, each ``[K, S]``.

    Kernel family ``'metric_classwise'`` (:mod:`calib_jax.kernels`): tuned
    :func:`_accumulate_classwise_blocked`, plain
    :func:`accumulate_classwise_plain`; float64 reference
    ``tests/_reference_metrics.py``.
    """
    return kernels.select(
        "metric_classwise",
        functools.partial(
            _accumulate_classwise_blocked, num_bins=num_bins, convention=convention
        ),
        functools.partial(
            accumulate_classwise_plain, num_bins=num_bins, convention=convention
        ),
        probs,
        labels,
        valid,
    )


def _correct_counts(probs, labels, valid, num_bins, convention, slots):
    """Per-class per-bin correct counts ``[K * S]``: only the label entry of
    each row is 1, so one scatter of ``N`` ones."""
    k = probs.shape[1]
    lab = labels.astype(jnp.int32)
    lab_bins = _conventions.bin_index(
        _common.label_prob(probs, lab), num_bins, convention
    )
    seg = jnp.where(valid & (lab_bins >= 0), lab * slots + lab_bins, k * slots)
    return jax.ops.segment_sum(jnp.ones(lab.shape, jnp.int32), seg, k * slots)


def accumulate_classwise_plain(probs, labels, valid, *, num_bins, convention):
    """Plain :func:`accumulate_classwise`: one ``.at[].add`` over ``[N, K]``."""
    k = probs.shape[1]
    slots = _conventions.num_slots(convention, num_bins)
    bins = _conventions.bin_index(probs, num_bins, convention)
    cls = lax.broadcasted_iota(jnp.int32, probs.shape, 1)
    keep = valid[:, None] & (bins >= 0)
    seg = jnp.where(keep, cls * slots + bins, k * slots)
    count = jnp.zeros((k * slots,), jnp.int32).at[seg].add(1, mode="drop")
    # Excluded rows may hold NaN: select (not multiply) them away.
    values = jnp.where(keep, probs, 0.0)
    sum_conf = jnp.zeros((k * slots,), probs.dtype).at[seg].add(values, mode="drop")
    n_correct = _correct_counts(probs, labels, valid, num_bins, convention, slots)
    shape = (k, slots)
    return count.reshape(shape), sum_conf.reshape(shape), n_correct.reshape(shape)


def _accumulate_classwise_blocked(probs, labels, valid, *, num_bins, convention):
    """Per-class per-bin statistics ``[K, S]`` in blocks of rows (lax.scan);
    tuned kernel of :func:`accumulate_classwise` (plain:
    :func:`accumulate_classwise_plain`).

    Most probabilities of a K-class softmax fall in bin 0, so bin 0 is not
    scattered: its count and sum are the column totals (one matrix-vector
    product) minus the other bins. Conventions that drop exact zeros from
    every bin scatter all bins instead.
    """
    n, k = probs.shape
    slots = _conventions.num_slots(convention, num_bins)
    rows = max(1, min(n, _CLASSWISE_BLOCK // k))
    derive_first = not (convention.side == "right" and convention.zero == "drop")
    lowest = 1 if derive_first else 0

    def block(p, v):
        bins = _conventions.bin_index(p, num_bins, convention)
        cls = lax.broadcasted_iota(jnp.int32, p.shape, 1)
        keep = v[:, None] & (bins >= lowest)
        seg = jnp.where(keep, cls * slots + bins, k * slots)
        val = lax.complex(p, jnp.ones_like(p))
        s = jax.ops.segment_sum(val.reshape(-1), seg.reshape(-1), k * slots)
        # Column totals of the included rows (excluded rows may hold NaN).
        col = v.astype(p.dtype) @ jnp.where(v[:, None], p, 0.0)
        return jnp.imag(s).astype(jnp.int32), jnp.real(s), col

    count = jnp.zeros((k * slots,), jnp.int32)
    sum_conf = jnp.zeros((k * slots,), probs.dtype)
    col_sum = jnp.zeros((k,), probs.dtype)
    full = n // rows
    if full:

        def body(carry, j):
            p = lax.dynamic_slice_in_dim(probs, j * rows, rows, 0)
            v = lax.dynamic_slice_in_dim(valid, j * rows, rows, 0)
            return tuple(a + b for a, b in zip(carry, block(p, v))), None

        init = (count, sum_conf, col_sum)
        (count, sum_conf, col_sum), _ = lax.scan(body, init, jnp.arange(full))
    if n - full * rows:
        c, s, col = block(probs[full * rows :], valid[full * rows :])
        count, sum_conf, col_sum = count + c, sum_conf + s, col_sum + col
    count, sum_conf = count.reshape(k, slots), sum_conf.reshape(k, slots)
    if derive_first:
        n_valid = jnp.sum(valid.astype(jnp.int32))
        count = count.at[:, 0].set(n_valid - jnp.sum(count, axis=1))
        sum_conf = sum_conf.at[:, 0].set(col_sum - jnp.sum(sum_conf, axis=1))
    n_correct = _correct_counts(probs, labels, valid, num_bins, convention, slots)
    return count, sum_conf, n_correct.reshape(k, slots)
