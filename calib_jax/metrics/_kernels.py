r"""Per-bin sums of top-label binned metrics (:class:`BinnedStats`, ECE).

Float sums go to one accumulator per block of ``_BLOCK`` rows and bin, then
add across blocks: that bounds float32 rounding to ~1e-7 relative, and with
row shards a multiple of ``_BLOCK`` rows each block lies on one device, so
sharded sums are the single-device program's bit for bit
(``docs/metrics.md``, "Class-axis sharding"; ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_BLOCK = 128


def slot(bins, valid, slots):
    """The accumulator of every row, ``slots`` (dropped) when it has none."""
    return jnp.where(valid & (bins >= 0) & (bins < slots), bins, slots)


def _block_sums(values, seg, slots):
    """``[slots, blocks]`` sums of ``values`` per slot and block of
    ``_BLOCK`` rows (``seg == slots``: dropped). Blocks on the minor axis: a
    TPU pads a minor axis of ``slots`` to 128 lanes."""
    n = values.shape[0]
    blocks = -(-n // _BLOCK)
    idx = seg * blocks + lax.iota(jnp.int32, n) // _BLOCK
    idx = jnp.where(seg < slots, idx, slots * blocks)
    sums = jnp.zeros((slots * blocks,), values.dtype).at[idx].add(values, mode="drop")
    return sums.reshape(slots, blocks)


def _float_sums(values, seg, slots):
    """Per-slot sums of ``values`` (``seg == slots``: dropped), by block."""
    return jnp.sum(_block_sums(values, seg, slots), axis=1)


def accumulate_top_label(conf, correct, bins, valid, slots):
    """Per-slot ``(count, sum conf, sum correct)``, each ``[slots]``, of the
    included rows; a row with ``bins`` outside ``[0, slots)`` counts nowhere."""
    seg = slot(bins, valid, slots)
    count = jnp.zeros((slots,), jnp.int32).at[seg].add(1, mode="drop")
    sum_conf = _float_sums(conf, seg, slots)
    ones = correct.astype(jnp.int32)
    n_correct = jnp.zeros((slots,), jnp.int32).at[seg].add(ones, mode="drop")
    return count, sum_conf, n_correct


def gap_sums_top_label(conf, correct, bins, valid, slots):
    """Per-slot sums of ``conf - correct``, ``[slots]``: all an ECE needs when
    only empty bins are skipped."""
    gap = conf - correct.astype(conf.dtype)
    seg = slot(bins, valid, slots)
    return _float_sums(gap, seg, slots)
