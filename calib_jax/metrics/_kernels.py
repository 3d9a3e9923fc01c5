r"""Per-bin sums of top-label binned metrics (:class:`BinnedStats`, ECE).

One ``.at[bin].add`` per statistic: on the CPU 20-30x faster than a one-hot
bin reduction, and on a TPU fewer bytes accessed (``benchmarks/RESULTS.md``,
"Metric kernels on TPU"). Float sums go to one accumulator per block of
``_BLOCK`` rows and bin, then add across blocks: XLA:CPU adds a block's rows
in row order, and a float32 running sum of up to 2048 confidences near 1 was
off by several 1e-6 relative; over 128 rows it stays near float32's own
rounding, 1e-7 (figures in ``benchmarks/RESULTS.md``).

The blocks follow the row index, so they align with row shards. With the
rows sharded and every device's share a multiple of ``_BLOCK`` rows, each
block lies on one device: the SPMD partitioner scatters each device's rows
into its own zeroed ``[slots * blocks]`` buffer and all-reduces the buffers,
adding exact zeros, before the sum over blocks, so the sums (and the ECE,
RMSCE and :class:`BinnedStats` from them) are the single-device program's
bit for bit (``tests/metrics/test_vocab_sharded.py``, 512 rows a device on a
2 x 4 mesh). A share of another size splits one block between two devices:
its rows add in two running sums that are then added, a float32 difference
of about 1e-7 of the bin's sum. ``tests/metrics/test_float_sums.py`` checks
the sums against float64 and that a block-aligned split of the rows leaves
every block's sum as it is.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_BLOCK = 128


def _slot(bins, valid, slots):
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
    r"""Per-slot ``(count, sum conf, sum correct)``, each ``[slots]``.

    :math:`n_s = \sum_i [b_i = s]`, :math:`S^c_s = \sum_i [b_i = s] c_i`,
    :math:`S^a_s = \sum_i [b_i = s] a_i` over the included rows; a row with
    ``bins`` outside ``[0, slots)`` counts nowhere. Float64 reference
    ``tests/_reference_metrics.py``.
    """
    seg = _slot(bins, valid, slots)
    count = jnp.zeros((slots,), jnp.int32).at[seg].add(1, mode="drop")
    sum_conf = _float_sums(conf, seg, slots)
    ones = correct.astype(jnp.int32)
    n_correct = jnp.zeros((slots,), jnp.int32).at[seg].add(ones, mode="drop")
    return count, sum_conf, n_correct


def gap_sums_top_label(conf, correct, bins, valid, slots):
    r"""Per-slot :math:`\sum_{i \in s} (c_i - a_i)`, ``[slots]``.

    All an ECE needs when only empty bins are skipped:
    :math:`\sum_s |\sum_{i \in s} (c_i - a_i)| / N`.
    """
    gap = conf - correct.astype(conf.dtype)
    seg = _slot(bins, valid, slots)
    return _float_sums(gap, seg, slots)
