"""MaC-Cal stage II end to end on digits: only the head moves, q follows Eq. 12."""

import jax
import numpy as np
import pytest

from calib_jax import data
from calib_jax.train import loop, setup as setup_lib, two_stage
from configs import digits_ce, digits_two_stage

STEPS_PER_EPOCH = 9  # ceil(1077 / 128)


def _digits_stats():
    d = data.get_dataset("digits")
    return d.mean, d.std


@pytest.fixture(scope="module")
def stage_one(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("stage1")
    config = digits_ce.get_config()
    config.num_steps = 60
    config.shifts.corruptions = "none"
    loop.train_and_evaluate(config, workdir)
    return workdir


@pytest.mark.long
def test_stage_two_moves_only_the_head_and_q_follows_eq12(stage_one, tmp_path):
    config = digits_two_stage.get_config(f"stage1={stage_one},epochs=3")
    config.shifts.corruptions = "none"
    run = setup_lib.build(config, tmp_path)
    assert run.num_steps == 3 * STEPS_PER_EPOCH
    state = run.init_state()
    frozen_before = jax.device_get(state.extra["frozen"])
    # The frozen variables are exactly stage I's: they reproduce its test logits.
    stage = two_stage.build_stage_two(config, data.get_dataset("digits"))
    test = data.load_digits("test")
    images = data.augment.normalize(test["image"], *_digits_stats())
    with np.load(stage_one / "logits" / "test.npz") as f:
        want = f["logits"]
    got = stage.feature_model.apply(frozen_before, images)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    q = float(state.extra["q"])
    assert q == 0.5
    kernel0 = np.asarray(state.params["bottleneck"]["kernel"])
    sums = np.zeros(3)
    for step in range(run.num_steps):
        state, metrics = run.step(state, step)
        m = jax.device_get(metrics)
        sums += [m["train/correct"], m["train/confidence"], m["train/count"]]
        # The retention in force after the step, logged through the stage's hook.
        assert m["two_stage/q"] == jax.device_get(state.extra["q"])
        if step == STEPS_PER_EPOCH - 2:
            # Within epoch 1 one mask is in force: plain SGD changes only the
            # kept kernel entries (Eq. 11), and about a fraction q = 0.5 is kept.
            kept = np.asarray(
                two_stage.masks_for(state, state.params, 0)["bottleneck"]["kernel"]
            )
            moved = np.asarray(state.params["bottleneck"]["kernel"]) != kernel0
            assert abs(kept.mean() - 0.5) < 0.03
            assert moved.any() and not (moved & (kept == 0)).any()
        if (step + 1) % STEPS_PER_EPOCH == 0:
            epoch = (step + 1) // STEPS_PER_EPOCH
            acc, conf = sums[0] / sums[2], sums[1] / sums[2]
            bound = 0.1 * np.exp(np.log(0.001 / 0.1) * epoch / 3)
            q = min(max(q + np.clip(conf - 0.9 * acc, -bound, bound), 0.0), 1.0)
            np.testing.assert_allclose(float(state.extra["q"]), q, rtol=1e-5)
            sums[:] = 0
    frozen_after = jax.device_get(state.extra["frozen"])
    for a, b in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(frozen_after)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.asarray(state.params["out"]["kernel"]), 0.0)


def test_stage_two_needs_a_stage_one_run(tmp_path):
    config = digits_two_stage.get_config(f"stage1={tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="holds no stage-I run"):
        setup_lib.build(config, tmp_path / "w")


def test_bounds_of_eq13_reach_eta_final_at_the_last_epoch():
    assert np.isclose(float(two_stage.retention_bound(3, 3, 0.1, 0.001)), 0.001)
