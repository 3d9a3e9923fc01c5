"""``config.model.dtype='bfloat16'``: bf16 compute, float32 state, same accuracy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import models
from calib_jax.train import loop, setup
from configs import digits_ce


def _config(dtype: str, **overrides):
    config = digits_ce.get_config()
    config.model.dtype = dtype
    config.shifts.corruptions = "none"
    for key, value in overrides.items():
        config[key] = value
    return config


def _float_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]


@pytest.mark.long
def test_bfloat16_computes_in_bf16_and_keeps_float32_state(tmp_path):
    run = setup.build(_config("bfloat16", num_steps=3), tmp_path / "w")
    state = run.init_state()
    for _ in range(3):
        state, metrics = run.step(state, int(jax.device_get(state.step)))
    leaves = _float_leaves(state.params) + _float_leaves(state.opt_state)
    assert leaves and all(x.dtype == jnp.float32 for x in leaves)
    assert all(v.dtype == jnp.float32 for v in metrics.values())
    # The model itself runs in bf16: its hidden activations are bf16 and its
    # logits are returned in float32.
    model = models.from_config(run.config.model, num_classes=10)
    images = jnp.ones((2, 8, 8, 1), jnp.float32)
    logits, inter = model.apply(
        {"params": state.params}, images, capture_intermediates=True
    )
    hidden = [
        v[0]
        for k, v in jax.tree_util.tree_leaves_with_path(inter)
        if "layers_0" in jax.tree_util.keystr(k)
    ]
    assert hidden and hidden[0].dtype == jnp.bfloat16
    assert logits.dtype == jnp.float32
    # Different from float32 compute, so bf16 really is in use.
    f32 = models.from_config(_config("float32").model, num_classes=10)
    exact = f32.apply({"params": state.params}, images)
    assert not np.array_equal(np.asarray(logits), np.asarray(exact))
    np.testing.assert_allclose(logits, exact, rtol=0.05, atol=0.05)


@pytest.mark.slow
def test_bfloat16_digits_accuracy_within_one_point_of_float32(tmp_path):
    accuracy = {}
    for dtype in ("float32", "bfloat16"):
        summary = loop.train_and_evaluate(
            _config(dtype), tmp_path / dtype, progress=False
        )
        accuracy[dtype] = summary["test/accuracy"]
    assert accuracy["float32"] >= 0.95
    assert abs(accuracy["bfloat16"] - accuracy["float32"]) <= 0.01, accuracy


@pytest.mark.parametrize("name", [jnp.bfloat16, "bfloat16", jnp.dtype("float16")])
def test_check_dtype_accepts_dtype_objects_and_names(name):
    assert models.check_dtype(name) in (jnp.bfloat16, jnp.float16)
