"""MaC-Cal's adaptive sparsity rules (Eqs. 12-13) and masks (Eq. 8)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from calib_jax.train import two_stage
from calib_jax.train.state import TrainState


def test_bound_decays_from_eta_init_to_eta_final():
    total = 5
    got = [
        float(two_stage.retention_bound(t, total, 0.1, 0.001)) for t in range(total + 1)
    ]
    want = [0.1 * math.exp(math.log(0.001 / 0.1) * t / total) for t in range(total + 1)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] == np.float32(0.1) and abs(got[-1] - 0.001) < 1e-8


def test_q_follows_eq12_on_a_scripted_sequence():
    # (confidence, accuracy) per epoch, chosen so that some updates are clipped
    # by the bound, some are not, and the last would leave [0, 1].
    script = [(0.95, 0.80), (0.70, 0.90), (0.90, 0.95), (0.99, 0.50), (0.99, 0.10)]
    gamma, total, q = 0.9, len(script), 0.5
    expected, got = [], []
    q_jax = jnp.float32(0.5)
    for t, (conf, acc) in enumerate(script, start=1):
        bound = 0.1 * math.exp(math.log(0.001 / 0.1) * t / total)
        step = min(max(conf - gamma * acc, -bound), bound)
        q = min(max(q + step, 0.0), 1.0)
        expected.append(q)
        q_jax = two_stage.update_retention(
            q_jax,
            jnp.float32(conf),
            jnp.float32(acc),
            gamma=gamma,
            bound=two_stage.retention_bound(t, total, 0.1, 0.001),
        )
        got.append(float(q_jax))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # Epoch 1: 0.95 - 0.72 = 0.23 is clipped to the bound 0.1 * 0.01**0.2.
    np.testing.assert_allclose(got[0], 0.5 + 0.1 * 0.01**0.2, rtol=1e-6)
    # Epoch 2: 0.70 - 0.81 = -0.11, clipped to -bound(2).
    np.testing.assert_allclose(got[1] - got[0], -0.1 * 0.01**0.4, rtol=1e-5)


def test_q_is_clamped_to_unit_interval():
    q = two_stage.update_retention(
        jnp.float32(0.99), jnp.float32(1.0), jnp.float32(0.0), gamma=0.9, bound=0.1
    )
    assert float(q) == 1.0
    q = two_stage.update_retention(
        jnp.float32(0.01), jnp.float32(0.0), jnp.float32(1.0), gamma=0.9, bound=0.1
    )
    assert float(q) == 0.0


@pytest.mark.long
def test_masks_cover_kernels_only_with_rate_q():
    head = two_stage.BottleneckHead(width=64, num_classes=10)
    params = head.init(jax.random.key(0), jnp.zeros((1, 128)))["params"]
    masks = two_stage.sample_masks(params, 0.3, jax.random.key(1))
    kernel = np.asarray(masks["bottleneck"]["kernel"])
    assert set(np.unique(kernel)) <= {0.0, 1.0}
    assert abs(kernel.mean() - 0.3) < 0.02  # 8192 Bernoulli draws
    np.testing.assert_array_equal(masks["bottleneck"]["bias"], 1.0)
    np.testing.assert_array_equal(masks["out"]["bias"], 1.0)
    assert abs(np.asarray(masks["out"]["kernel"]).mean() - 0.3) < 0.05


def test_hook_reports_the_retention_q_as_its_metric():
    ts = ConfigDict(dict(q0=0.5, eta_init=0.1, eta_final=0.001, gamma=0.9))
    stage = two_stage.StageTwo(ConfigDict({"two_stage": ts}), None, None, {}, (8, 8, 1))
    hook = stage.hooks(steps_per_epoch=2, num_steps=4)["extra_hook"]
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    labels = jnp.array([0, 0, 0])
    mask = jnp.array([True, True, False])
    zero = jnp.float32(0.0)
    extra = dict(
        frozen={}, q=jnp.float32(0.5), correct=zero, confidence=zero, count=zero
    )

    def state(step, extra):
        return TrainState(
            step=jnp.int32(step),
            params={},
            batch_stats={},
            opt_state=(),
            rng=None,
            extra=extra,
        )

    extra, metrics = hook(state(0, extra), logits, labels, mask)  # mid-epoch
    assert float(metrics["two_stage/q"]) == 0.5 == float(extra["q"])
    assert float(extra["count"]) == 2.0 and float(extra["correct"]) == 1.0
    extra, metrics = hook(state(1, extra), logits, labels, mask)  # epoch 1 ends
    p = jax.nn.softmax(logits[:2], axis=-1).max(-1)
    conf, acc = float(2 * p.sum() / 4), 0.5
    bound = 0.1 * math.exp(math.log(0.001 / 0.1) * 1 / 2)
    want = 0.5 + min(max(conf - 0.9 * acc, -bound), bound)
    np.testing.assert_allclose(float(metrics["two_stage/q"]), want, rtol=1e-6)
    assert float(metrics["two_stage/q"]) == float(extra["q"])
    assert float(extra["count"]) == 0.0
