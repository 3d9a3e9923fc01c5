"""The streamed summary's read-ahead (chunks.prefetched, ChunkSource(prefetch=))
and its fused from-logits row pass (_logit_rows.fused_rows).

The read-ahead: items in order, never more than ``depth`` ahead of the
consumer, an error raised in the reading thread reaching the consumer as the
same exception after every item before it, the thread stopped when the
consumer stops. The fused pass: the confidence and correctness bit for bit
those of every metric's ``from_logits=True`` (``_inputs.rows_from_logits``),
the NLL and Brier rows against float64 NumPy, on bf16 logits whose
top-label probabilities pile at and just below 1.0, with ties.
"""

from __future__ import annotations

import threading

import jax
import ml_dtypes
import numpy as np
import pytest

from calib_jax import chunks, metrics
from calib_jax.metrics import _inputs, _logit_rows
from calib_jax.metrics._streamed import summary_of_chunks

_WAIT = 60.0  # seconds; a generous bound on a thread's progress, never a verdict


class _Counted:
    """Items 0..n-1, counting how many were produced; raises ``error`` in
    place of item ``fail_at``."""

    def __init__(self, n, fail_at=None, error=None):
        self.n, self.fail_at, self.error = n, fail_at, error
        self.produced = 0
        self.changed = threading.Condition()

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise self.error
            with self.changed:
                self.produced += 1
                self.changed.notify_all()
            yield i

    def wait_for(self, count) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.produced >= count, _WAIT)


@pytest.mark.parametrize("depth", [1, 2])
def test_prefetch_order_and_bounded_lookahead(depth):
    items = _Counted(9)
    seen = []
    for i in chunks.prefetched(items, depth):
        # The thread reads ahead up to depth items, and never further.
        assert items.wait_for(min(i + 1 + depth, items.n))
        assert items.produced <= i + 1 + depth
        seen.append(i)
    assert seen == list(range(9))


def test_prefetch_depth_0_is_the_items_themselves():
    items = _Counted(4)
    out = chunks.prefetched(items, 0)
    assert next(out) == 0 and items.produced == 1
    assert list(out) == [1, 2, 3]


def test_prefetch_error_in_the_thread_is_raised_after_the_items_before_it():
    error = ValueError("shard 'x.npy' is truncated: rows 2..3 of 4 could not be read.")
    items = _Counted(6, fail_at=3, error=error)
    seen = []
    with pytest.raises(ValueError) as err:
        for i in chunks.prefetched(items, 2):
            seen.append(i)
    assert err.value is error
    assert seen == [0, 1, 2]


def test_prefetch_closed_early_stops_the_thread():
    before = set(threading.enumerate())
    items = _Counted(1000)
    out = chunks.prefetched(items, 2)
    assert next(out) == 0
    (thread,) = set(threading.enumerate()) - before
    out.close()
    assert not thread.is_alive()
    assert items.produced <= 3


# ---------------------------------------------------------------- shards

K = 300


def _shards(tmp_path, stem, sizes, seed=0, bad_label=None):
    rng = np.random.default_rng(seed)
    paths, xs, ys = [], [], []
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, K)).astype(ml_dtypes.bfloat16)
        y = rng.integers(0, K, n).astype(np.int32)
        if bad_label is not None and bad_label[0] == i:
            y[bad_label[1]] = K
        paths.append(str(tmp_path / f"{stem}-{i}.npy"))
        np.save(paths[-1], x)
        np.save(tmp_path / f"{stem}-{i}.labels.npy", y)
        xs.append(x)
        ys.append(y)
    return paths, np.concatenate(xs), np.concatenate(ys)


def test_prefetched_chunks_equal_the_chunks_read_in_order(tmp_path):
    paths, x, y = _shards(tmp_path, "s", (70, 5, 90))
    plain = list(chunks.ChunkSource(paths, chunk_rows=32, progress_bar=False))
    ahead = list(
        chunks.ChunkSource(paths, chunk_rows=32, progress_bar=False, prefetch=2)
    )
    assert len(ahead) == len(plain) == 6
    for a, b in zip(ahead, plain):
        assert (a.index, a.spans) == (b.index, b.spans)
        assert not isinstance(a.x, np.memmap)  # read in the thread
        np.testing.assert_array_equal(a.x.view(np.uint16), b.x.view(np.uint16))
        np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(
        np.concatenate([c.x for c in ahead]).view(np.uint16), x.view(np.uint16)
    )


def test_error_in_the_reading_thread_is_the_one_line_error_naming_the_shard(tmp_path):
    # A label outside [0, K) in row 7 of the third shard: found only while
    # reading, in the prefetching thread.
    paths, _, _ = _shards(tmp_path, "b", (40, 40, 40), bad_label=(2, 7))
    errors = []
    for prefetch in (0, 2):
        source = chunks.ChunkSource(
            paths, chunk_rows=32, progress_bar=False, prefetch=prefetch
        )
        with pytest.raises(ValueError) as err:
            list(source)
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "\n" not in errors[1] and repr(paths[2]) in errors[1]
    with pytest.raises(ValueError) as err:
        summary_of_chunks(paths, from_logits=True, chunk_rows=32, progress_bar=False)
    assert str(err.value) == errors[0]


def test_bad_prefetch_option():
    pairs = [(np.eye(2), np.arange(2))]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="^prefetch must be an int >= 0, got"):
            chunks.ChunkSource(pairs, prefetch=bad)


# ---------------------------------------------------------- the fused pass


def _piled_logits(n, k, seed):
    """bf16 logits as a classifier gives them: top-label probabilities from
    about 0.3 to piled at exactly 1.0 in float32 (margin 40) and just below
    it (margins 12 to 22); some rows with two maximal classes (bf16 ties),
    the label either of them; one row each with NaN, +inf and -inf."""
    rng = np.random.default_rng(seed)
    z = (2.0 * rng.normal(size=(n, k))).astype(np.float32)
    top = rng.integers(1, k, n)
    z[np.arange(n), top] += rng.choice([0.0, 3.0, 12.0, 17.0, 22.0, 40.0], n)
    labels = np.where(rng.random(n) < 0.8, top, rng.integers(0, k, n))
    tie = np.arange(0, n, 7)
    z[tie, top[tie] - 1] = z[tie, top[tie]]  # the first maximal is top - 1
    labels[tie[::2]] = top[tie[::2]] - 1
    x = z.astype(ml_dtypes.bfloat16)
    x[3, 5], x[4, 0], x[5, k - 1] = np.nan, np.inf, -np.inf
    return x, labels.astype(np.int32)


_FUSED = jax.jit(_logit_rows.fused_rows)
_ROWS = jax.jit(_inputs.rows_from_logits)


# [64, 300]: one block; [70, 32768]: 2 blocks of 32 rows (2**20 entries) and
# 6 rows after them, as a large label space's chunk is cut on the CPU.
@pytest.mark.parametrize("n, k", [(64, 300), (70, 32768)])
def test_fused_rows_against_float64_numpy(n, k):
    x, labels = _piled_logits(n, k, seed=k)
    conf, correct, log_p, brier, finite = jax.device_get(_FUSED(x, labels))
    z = x.astype(np.float64)
    ok = np.all(np.isfinite(z), axis=1)
    np.testing.assert_array_equal(finite, ok)
    assert not ok[3:6].any() and ok.sum() == n - 3

    # Top-label rows: the bits of every metric's from_logits=True.
    rows = jax.device_get(_ROWS(x, labels))
    np.testing.assert_array_equal(
        conf[ok].view(np.uint32), rows.confidence[ok].view(np.uint32)
    )
    np.testing.assert_array_equal(correct[ok], rows.correct[ok])

    zf = z[ok]
    p = np.exp(zf - zf.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = labels[ok]
    r = np.arange(len(y))
    np.testing.assert_array_equal(correct[ok], np.argmax(zf, axis=1) == y)
    piled, below = conf[ok] == 1.0, (conf[ok] < 1.0) & (conf[ok] > 0.999)
    assert piled.sum() >= 3 and below.sum() >= 3
    np.testing.assert_allclose(conf[ok], p.max(axis=1), rtol=4e-6)
    log_p64 = np.log(p[r, y])
    np.testing.assert_allclose(log_p[ok], log_p64, rtol=1e-5, atol=1e-5)
    brier64 = np.sum(p * p, axis=1) - 2.0 * p[r, y] + 1.0
    np.testing.assert_allclose(brier[ok], brier64, rtol=0, atol=2e-6)


def test_streamed_from_logits_equals_the_in_memory_summary(tmp_path):
    """The fused pass in the chunk step (chunks of 480 x 300 entries, the
    last padded) against metrics.summary(from_logits=True): the top-label
    metrics exactly, NLL and Brier to float32 rounding."""
    x, labels = _piled_logits(1000, K, seed=1)
    x[3, 5] = x[4, 0] = x[5, K - 1] = 0.0
    for i, (a, b) in enumerate([(0, 300), (300, 1000)]):
        np.save(tmp_path / f"z-{i}.npy", x[a:b])
        np.save(tmp_path / f"z-{i}.labels.npy", labels[a:b])
    out = summary_of_chunks(
        str(tmp_path / "z-*.npy"),
        from_logits=True,
        chunk_rows=480,
        names=("accuracy", "ece", "adaptive_ece", "aurc", "nll", "brier"),
        progress_bar=False,
    )
    ref = metrics.summary(x, labels, from_logits=True, names=tuple(out))
    for key in ("accuracy", "ece", "adaptive_ece", "aurc"):
        assert float(out[key]) == float(ref[key]), key
    for key in ("nll", "brier"):
        np.testing.assert_allclose(float(out[key]), float(ref[key]), rtol=1e-6)
