"""A diverging run stops with one clear error and keeps its good checkpoints."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import _cli
from calib_jax.train import loop, setup as setup_lib
from calib_jax.train.checkpoint import Checkpointer
from configs import digits_ce

# SGD at 0.1 for steps 1-30, then the learning rate jumps to 1e7.
JUMP = (
    "--config.optimizer.name=sgd",
    "--config.optimizer.learning_rate=0.1",
    "--config.schedule.name=piecewise",
    "--config.schedule.boundaries=(0.5,)",
    "--config.schedule.decay_factor=1e8",
    "--config.num_steps=60",
    "--config.log_every=5",
    "--config.checkpoint_every=10",
    "--config.shifts.corruptions=none",
)


def _config(**overrides):
    c = digits_ce.get_config()
    c.optimizer.name, c.optimizer.learning_rate = "sgd", 0.1
    c.schedule.name, c.schedule.boundaries, c.schedule.decay_factor = (
        "piecewise",
        (0.5,),
        1e8,
    )
    c.num_steps, c.log_every, c.checkpoint_every = 60, 5, 10
    c.shifts.corruptions = "none"
    for key, value in overrides.items():
        c[key] = value
    return c


@pytest.mark.long
def test_nan_loss_stops_the_run_and_keeps_the_finite_checkpoints(tmp_path):
    config = _config()
    with pytest.raises(
        FloatingPointError,
        match=r"training diverged: loss/\w+ is nan in steps 31-35; "
        r"the good checkpoints end at step 30\.",
    ):
        loop.train_and_evaluate(config, tmp_path, progress=False)
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir())
    assert steps == [10, 20, 30]
    run = setup_lib.build(config, tmp_path)
    ckpt = Checkpointer(tmp_path)
    state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    assert int(jax.device_get(state.step)) == 30
    leaves = jax.tree.leaves(jax.device_get(state.params))
    assert all(np.all(np.isfinite(x)) for x in leaves)
    assert not (tmp_path / "logits").exists()  # no evaluation of a broken model


def test_non_finite_parameters_are_never_checkpointed(tmp_path):
    # Diverges within the first 10 steps; the loss is only logged at step 20.
    config = _config(log_every=20)
    config.optimizer.learning_rate = 1e6
    config.schedule.name = "constant"
    with pytest.raises(
        FloatingPointError,
        match="the parameters are not finite after step 10; no checkpoint was saved",
    ):
        loop.train_and_evaluate(config, tmp_path, progress=False)
    assert not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.long
def test_debug_nans_names_the_operation(tmp_path):
    config = _config(debug_nans=True, num_steps=10)
    config.optimizer.learning_rate = 1e6  # NaN within the first steps
    config.schedule.name = "constant"
    with pytest.raises(
        FloatingPointError, match=r"invalid value \(nan\) encountered in"
    ):
        loop.train_and_evaluate(config, tmp_path, progress=False)


@pytest.mark.long
def test_cli_divergence_is_one_line_and_exit_status_3(tmp_path):
    result = _cli.run("digits_ce.py", tmp_path, *JUMP)
    assert result.returncode == 3, result.stderr[-2000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1
    assert "training diverged" in errors[0] and "step 30" in errors[0]
    assert "Traceback" not in result.stderr
