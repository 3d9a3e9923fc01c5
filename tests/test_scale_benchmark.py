"""The helpers of benchmarks/scale.py: its shards read back through
``calib_jax.chunks``, its NumPy peer against float64 references, and its
device-mode metrics against ``metrics.summary`` (run here on the CPU)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_metrics import ece as reference_ece

from calib_jax import chunks, metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import scale

K = 300


def _blocks(rows, shard_rows, block_rows, seed=0):
    """The rows that write_shards writes, generated again in memory."""
    xs, ys, prior = [], [], scale.class_prior(K, seed)
    for start, stop in scale.shard_layout(rows, shard_rows):
        for a in range(start, stop, block_rows):
            x, y = scale.block_logits(seed, a, min(block_rows, stop - a), prior)
            xs.append(x)
            ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _softmax64(x):
    z = np.asarray(x, np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def test_shards_read_back_through_chunk_source(tmp_path):
    """45 rows in shards of 20 (the last 5 rows), blocks of 8: ChunkSource in
    chunks of 16 gives back every row and label, as bf16; a second call with
    the same sizes reuses the files, another seed rewrites them."""
    paths, written = scale.write_shards(
        tmp_path, rows=45, num_classes=K, shard_rows=20, block_rows=8
    )
    assert written and [p.name for p in paths] == [
        f"logits-0000{i}.npy" for i in range(3)
    ]
    x, y = _blocks(45, 20, 8)
    source = chunks.ChunkSource(
        str(tmp_path / "logits-*.npy"), chunk_rows=16, progress_bar=False
    )
    assert (source.num_rows, source.num_classes, source.dtype) == (45, K, scale.BF16)
    got = list(source)
    assert [c.x.shape[0] for c in got] == [16, 16, 13]
    np.testing.assert_array_equal(
        np.concatenate([c.x for c in got]).view(np.uint16), x.view(np.uint16)
    )
    np.testing.assert_array_equal(np.concatenate([c.labels for c in got]), y)
    sizes = sum(p.stat().st_size for p in scale.all_files(paths))
    assert scale.read_all(scale.all_files(paths), block=1000) == sizes
    mtime = paths[0].stat().st_mtime_ns
    assert not scale.write_shards(
        tmp_path, rows=45, num_classes=K, shard_rows=20, block_rows=8
    )[1]
    assert paths[0].stat().st_mtime_ns == mtime
    assert scale.write_shards(
        tmp_path, rows=45, num_classes=K, shard_rows=20, block_rows=8, seed=1
    )[1]
    x1, _ = _blocks(45, 20, 8, seed=1)
    np.testing.assert_array_equal(
        np.load(paths[0]).view(np.uint16), x1[:20].view(np.uint16)
    )


def test_logits_look_like_a_language_model():
    """Confidences piled at and just below 1.0 and spread below; the label
    is the boosted class in most rows."""
    x, y = _blocks(400, 400, 400)
    z = x.astype(np.float32)
    conf = 1.0 / np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)  # float32
    assert np.mean(conf == 1.0) > 0.03
    assert np.mean(conf > 0.999) > 0.3
    assert np.mean(conf < 0.5) > 0.1
    assert 0.6 < np.mean(z.argmax(axis=1) == y) < 0.95


def test_numpy_peer_against_float64_references():
    """NLL, Brier and accuracy against float64 NumPy; ECE and adaptive ECE
    against the float64 reference metrics (calib_jax convention) of the
    float32 softmax's confidences."""
    x, y = _blocks(400, 400, 400)
    out = scale.numpy_metrics(x, y)
    p = _softmax64(x.astype(np.float32))
    p_label = p[np.arange(len(y)), y]
    np.testing.assert_allclose(out["nll"], -np.mean(np.log(p_label)), rtol=1e-5)
    brier = np.mean(np.sum(p * p, axis=1) - 2 * p_label + 1)
    np.testing.assert_allclose(out["brier"], brier, rtol=1e-5)
    assert out["accuracy"] == np.mean(p.argmax(axis=1) == y)
    # The confidences in float32 (ties at 1.0 as the float32 softmax has them).
    p32 = p.astype(np.float32).astype(np.float64)
    for key, binning in (("ece", "width"), ("adaptive_ece", "mass")):
        ref = reference_ece(p32, y, 15, binning=binning)
        np.testing.assert_allclose(out[key], ref, rtol=1e-6, err_msg=key)


@pytest.mark.long
def test_device_mode_metrics_equal_the_summary():
    """The device mode's chunked metrics (public API under jit) equal
    ``metrics.summary(..., from_logits=True)`` of the concatenated chunks,
    on chunks that its own generator made (on the CPU here)."""
    base, cdf, log_s0 = scale.device_prior(K, 0)
    make = jax.jit(lambda key: scale.device_chunk(key, 128, base, cdf, log_s0))
    data = [make(key) for key in jax.random.split(jax.random.key(0), 3)]
    x = jnp.concatenate([c[0] for c in data])
    y = jnp.concatenate([c[1] for c in data])
    assert x.dtype == jnp.bfloat16 and x.shape == (384, K)
    assert 0 <= int(y.min()) and int(y.max()) < K
    out = scale.device_metrics(data, scale.device_functions())
    ref = metrics.summary(x, y, from_logits=True, names=scale.NAMES)
    for key in ("accuracy", "ece", "adaptive_ece"):
        assert float(out[key]) == float(ref[key]), key
    for key in ("nll", "brier"):
        np.testing.assert_allclose(float(out[key]), float(ref[key]), rtol=1e-6)


@pytest.mark.parametrize("rows", [1, 7])
def test_read_rows_takes_the_first_rows(tmp_path, rows):
    paths, _ = scale.write_shards(
        tmp_path, rows=12, num_classes=K, shard_rows=5, block_rows=5
    )
    x, y = scale.read_rows(paths, rows)
    x_all, y_all = _blocks(12, 5, 5)
    np.testing.assert_array_equal(x.view(np.uint16), x_all[:rows].view(np.uint16))
    np.testing.assert_array_equal(y, y_all[:rows])
