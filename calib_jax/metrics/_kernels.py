r"""Accumulation kernels of :class:`~calib_jax.metrics.BinnedStats`.

Both turn one batch into per-bin sums with scatter-adds over ``[N]`` (top
label) or blocks of ``[rows, K]`` (class-wise) values; neither materialises
an ``[N, bins]`` or ``[N, K]`` intermediate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _binning, _common

# Rows per accumulation block. A block's per-bin count and correct count are
# packed into one float32 as count * 4096 + correct (exact below 2**24).
_BLOCK = 2048
_PACK = 4096.0
# Elements per scan step of the class-wise accumulation.
_CLASSWISE_BLOCK = 1 << 18


def accumulate_top_label(conf, correct, bins, valid, slots):
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
    """Per-bin ``sum(conf - correct)`` with one float scatter-add (ECE fast path).

    For ``p = 1`` with only empty bins skipped, ECE needs nothing else:
    ``sum_b |sum_{i in b} (c_i - a_i)| / N``. Half the bytes of
    :func:`accumulate_top_label` per row, same blocks and lanes.
    """
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
    """Per-class per-bin statistics ``[K, S]`` in blocks of rows (lax.scan).

    Most probabilities of a K-class softmax fall in bin 0, so bin 0 is not
    scattered: its count and sum are the column totals (one matrix-vector
    product) minus the other bins. Conventions that drop exact zeros from
    every bin scatter all bins instead.
    """
    n, k = probs.shape
    slots = _binning.num_slots(convention, num_bins)
    rows = max(1, min(n, _CLASSWISE_BLOCK // k))
    derive_first = not (convention.side == "right" and convention.zero == "drop")
    lowest = 1 if derive_first else 0

    def block(p, v):
        bins = _binning.bin_index(p, num_bins, convention)
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
    # Correct counts: only the label entry of each row is 1.
    lab = labels.astype(jnp.int32)
    lab_bins = _binning.bin_index(_common.label_prob(probs, lab), num_bins, convention)
    seg = jnp.where(valid & (lab_bins >= 0), lab * slots + lab_bins, k * slots)
    n_correct = jax.ops.segment_sum(jnp.ones((n,), jnp.int32), seg, k * slots)
    return count, sum_conf, n_correct.reshape(k, slots)
