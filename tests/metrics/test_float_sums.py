"""Float32 per-bin sums by blocks of rows (``calib_jax.metrics._kernels``).

Confidences piled at and just below 1.0, as a softmax gives them: the bin
sums against float64 NumPy for sizes on both sides of a block boundary, and
the property a row-sharded program relies on (issue 23): a split of the rows
at a block boundary leaves every block's sum as it is, so the partial sums
of the two parts, added, are the sums of the whole bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.metrics import _kernels

B = _kernels._BLOCK
SLOTS = 15
# Block - 1, block, block + 1 and several blocks plus a remainder.
SIZES = (B - 1, B, B + 1, 5 * B + 37, 16 * B + 37)

_accumulate = jax.jit(_kernels.accumulate_top_label, static_argnums=4)
_gaps = jax.jit(_kernels.gap_sums_top_label, static_argnums=4)
_blocks = jax.jit(_kernels._block_sums, static_argnums=2)


def _rows(n, seed):
    """Float32 confidences: 40% exactly 1.0, 40% in [0.9999, 1) (down to
    ``1 - 2**-24``), 20% in [0.5, 1); an outcome drawn with that chance, the
    equal-width bin of 15, a tenth of the rows left out."""
    rng = np.random.default_rng(seed)
    kind = rng.random(n)
    near = (1.0 - rng.random(n) * 1e-4).astype(np.float32)
    near[::7] = np.float32(1.0 - 2.0**-24)
    spread = rng.uniform(0.5, 1.0, n).astype(np.float32)
    conf = np.where(kind < 0.4, np.float32(1.0), np.where(kind < 0.8, near, spread))
    conf = conf.astype(np.float32)
    correct = rng.random(n) < conf
    bins = np.minimum((conf.astype(np.float64) * SLOTS).astype(np.int32), SLOTS - 1)
    valid = rng.random(n) >= 0.1
    return conf, correct, bins, valid


@pytest.mark.parametrize("n", SIZES)
def test_bin_sums_against_float64(n):
    """Counts and correct counts exact; every bin's confidence and gap sum
    within 4e-7 of the float64 total over the bins (of ``|value|``). A block
    of ``B`` = 128 rows is a float32 running sum below 128: each addition
    rounds by at most 2**-18, with errors of either sign about
    ``sqrt(B) * 2**-18 / sqrt(3)``, 2e-7 of a block near 1 a row (2.6e-7 at
    most over 40 seeds a size, 1.3e-7 on these); the earlier block of 2048
    rows, one running sum, is off by 5.0e-7 here at ``16 * B + 37`` rows."""
    conf, correct, bins, valid = _rows(n, n)
    count, sum_conf, n_correct = _accumulate(conf, correct, bins, valid, SLOTS)
    gaps = _gaps(conf, correct, bins, valid, SLOTS)

    c64 = np.where(valid, conf.astype(np.float64), 0.0)
    g64 = np.where(valid, conf.astype(np.float64) - correct, 0.0)
    np.testing.assert_array_equal(count, np.bincount(bins, valid, SLOTS))
    np.testing.assert_array_equal(n_correct, np.bincount(bins, valid & correct, SLOTS))
    want = np.bincount(bins, c64, SLOTS)
    err = np.abs(np.asarray(sum_conf, np.float64) - want)
    assert np.all(err <= 4e-7 * want.sum()), err.max() / want.sum()
    want = np.bincount(bins, g64, SLOTS)
    err = np.abs(np.asarray(gaps, np.float64) - want)
    assert np.all(err <= 4e-7 * np.abs(g64).sum()), err.max() / np.abs(g64).sum()


def test_rows_split_at_a_block_boundary_keep_every_block_sum():
    """Rows ``[0, k * B)`` and ``[k * B, n)`` summed apart: their blocks are
    the whole call's blocks bit for bit, and the sum over the blocks of both,
    one after the other, is the whole call's. Split inside a block, the two
    partial sums of that block add in one more rounding."""
    n = 5 * B + 37
    conf, correct, bins, valid = _rows(n, 1)
    seg = np.where(valid, bins, SLOTS)
    whole = np.asarray(_blocks(conf, seg, SLOTS))
    total = np.asarray(_accumulate(conf, correct, bins, valid, SLOTS)[1])
    for k in (1, 2, 5):
        cut = k * B
        head = np.asarray(_blocks(conf[:cut], seg[:cut], SLOTS))
        tail = np.asarray(_blocks(conf[cut:], seg[cut:], SLOTS))
        assert head.shape == (SLOTS, k)
        both = np.concatenate([head, tail], axis=1)
        np.testing.assert_array_equal(both, whole)
        np.testing.assert_array_equal(np.asarray(jnp.sum(both, axis=1)), total)

    # The sharded program's form: each part scatters into its own zeroed
    # buffer of all the blocks (the other part's rows dropped), the buffers
    # add (exact zeros), then the blocks add.
    rows = np.arange(n)
    for cut, exact in ((2 * B, True), (2 * B + 37, False)):
        parts = [np.where(keep, seg, SLOTS) for keep in (rows < cut, rows >= cut)]
        added = sum(np.asarray(_blocks(conf, part, SLOTS)) for part in parts)
        if exact:
            np.testing.assert_array_equal(added, whole)
        else:
            scale = np.abs(whole).sum(axis=1)
            assert np.all(np.abs(added - whole).sum(axis=1) <= 2e-7 * scale)
