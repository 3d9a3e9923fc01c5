"""Mergeable statistics, jit, sharding and masking."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from metrics._cases import softmax_case

from calib_jax import metrics

BatchStats = metrics.BinnedStats


@pytest.mark.long
@pytest.mark.parametrize("classwise", [False, True])
def test_merge_over_100_batches_equals_one_shot(classwise):
    probs, labels = softmax_case(n=3000, k=10, seed=11)
    one_shot = BatchStats.from_batch(probs, labels, classwise=classwise)
    step = jax.jit(
        lambda s, p, y: s.merge(BatchStats.from_batch(p, y, classwise=classwise))
    )
    stats = BatchStats.empty(num_classes=10 if classwise else None)
    for p, y in zip(np.split(probs, 100), np.split(labels, 100)):
        stats = step(stats, p, y)
    # Counts are integers: exact. Confidence sums are float32 sums in a
    # different order (class-wise bin 0 is a column total minus the others).
    np.testing.assert_array_equal(stats.count, one_shot.count)
    np.testing.assert_array_equal(stats.sum_correct, one_shot.sum_correct)
    assert int(stats.total) == 3000
    np.testing.assert_allclose(stats.sum_conf, one_shot.sum_conf, rtol=1e-4)
    np.testing.assert_allclose(stats.compute(), one_shot.compute(), rtol=1e-6)
    expected = (metrics.classwise_ece if classwise else metrics.ece)(probs, labels)
    np.testing.assert_allclose(stats.compute(), expected, rtol=1e-6)


def test_merge_rejects_different_bins():
    a = BatchStats.empty(num_bins=10)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(BatchStats.empty(num_bins=15))


def test_sharded_ece_equals_single_device():
    assert jax.device_count() == 8
    probs, labels = softmax_case(n=4096, k=10, seed=12)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data"))
    p_sh = jax.device_put(probs, rows)
    y_sh = jax.device_put(labels, rows)
    f = jax.jit(lambda p, y: metrics.ece(p, y))
    sharded = f(p_sh, y_sh)
    single = f(jax.device_put(probs, jax.devices()[0]), labels)
    np.testing.assert_allclose(sharded, single, rtol=1e-6)
    cw = jax.jit(lambda p, y: metrics.classwise_ece(p, y))
    np.testing.assert_allclose(
        cw(p_sh, y_sh), metrics.classwise_ece(probs, labels), rtol=1e-6
    )
    stats = jax.jit(lambda p, y: BatchStats.from_batch(p, y))(p_sh, y_sh)
    np.testing.assert_allclose(stats.compute(), single, rtol=1e-6)


def test_where_equals_slicing_and_jit_equals_eager():
    # Every value test also runs on masked, padded inputs (see _cases.padded).
    probs, labels = softmax_case(n=300, k=10, seed=13)
    keep = np.random.default_rng(0).random(300) < 0.6
    for fn in (metrics.ece, metrics.aurc):
        masked = fn(probs, labels, where=keep)
        sliced = fn(probs[keep], labels[keep])
        np.testing.assert_allclose(masked, sliced, rtol=1e-5, atol=1e-7)
        jitted = jax.jit(lambda p, y, w, fn=fn: fn(p, y, where=w))(probs, labels, keep)
        np.testing.assert_allclose(jitted, masked, rtol=1e-6, atol=1e-7)


@pytest.mark.long
def test_nan_padding_with_bad_labels_is_ignored():
    probs, labels = softmax_case(n=200, k=10, seed=15)
    pad_p = np.concatenate([probs, np.full((56, 10), np.nan, np.float32)])
    pad_y = np.concatenate([labels, np.full(56, -1, np.int32)])
    keep = np.arange(256) < 200
    for fn in (metrics.ece, metrics.classwise_ece, metrics.brier, metrics.aurc):
        expected = fn(probs, labels)
        np.testing.assert_allclose(fn(pad_p, pad_y, where=keep), expected, rtol=1e-5)
        jitted = jax.jit(lambda p, y, w, fn=fn: fn(p, y, where=w))
        np.testing.assert_allclose(jitted(pad_p, pad_y, keep), expected, rtol=1e-5)


def test_bf16_in_float32_out_and_one_trace():
    probs, labels = softmax_case(n=256, k=10, seed=14)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(p, y):
        return metrics.ece(p, y)

    out = f(jnp.asarray(probs, jnp.bfloat16), labels)
    assert out.dtype == jnp.float32 and out.shape == ()
    f(jnp.asarray(probs[::-1], jnp.bfloat16), labels)  # same shapes: no retrace


def test_perfect_and_constant_predictions():
    # One-hot correct predictions are perfectly calibrated. A uniform
    # predictor predicts class 0 (first maximal class) with confidence 1/K;
    # on balanced labels its accuracy is 1/K too, so its ECE is 0.
    labels = np.arange(40, dtype=np.int32) % 4
    onehot = np.eye(4, dtype=np.float32)[labels]
    assert float(metrics.ece(onehot, labels)) == 0.0
    assert float(metrics.classwise_ece(onehot, labels)) == 0.0
    uniform = np.full((40, 4), 0.25, np.float32)
    assert float(metrics.ece(uniform, labels)) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics.accuracy(uniform, labels)) == 0.25
