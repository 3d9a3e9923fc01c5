"""Preemption: SIGTERM saves and exits 0, SIGINT saves and exits 130; an unreadable
checkpoint is skipped."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

import _cli
import _kill
from calib_jax.train import loop, metrics_log
from calib_jax.train import setup as setup_lib
from calib_jax.train.checkpoint import Checkpointer
from configs import digits_ce

QUICK = (
    "--config.num_steps=400",
    "--config.checkpoint_every=100",
    "--config.log_every=10",
    "--config.shifts.corruptions=none",
)


@pytest.mark.long
def test_sigterm_checkpoints_exits_zero_and_resumes_to_the_same_result(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert _cli.run("digits_ce.py", straight, *QUICK).returncode == 0
    proc = subprocess.Popen(
        _cli.command("digits_ce.py", stopped, *QUICK),
        cwd=_cli.ROOT,
        env=_cli.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = stopped / "metrics.jsonl"
    deadline = time.time() + 900
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-2000:]
    steps = sorted(
        int(p.name) for p in (stopped / "checkpoints").iterdir() if p.name.isdigit()
    )
    # It stopped early, at a step that is not a regular checkpoint step.
    assert steps and steps[-1] < 400 and "SIGTERM" in err
    assert not (stopped / "logits").exists()
    result = _cli.run("digits_ce.py", stopped, *QUICK)
    assert result.returncode == 0, result.stderr[-2000:]
    # It resumed from the SIGTERM checkpoint (a restart would log step 10 again).
    logged = [r["step"] for r in metrics_log.load_jsonl(metrics) if "loss/total" in r]
    assert logged.count(10) == 1 and logged.count(400) == 1, logged
    with (
        np.load(straight / "logits" / "test.npz") as a,
        np.load(stopped / "logits" / "test.npz") as b,
    ):
        np.testing.assert_array_equal(a["logits"], b["logits"])


@pytest.mark.long
def test_unreadable_latest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    config = digits_ce.get_config()
    config.num_steps, config.checkpoint_every = 30, 10
    config.shifts.corruptions = "none"
    loop.train_and_evaluate(config, tmp_path)
    latest = tmp_path / "checkpoints" / "30"
    # Damage the newest checkpoint: drop its array data.
    for path in sorted(latest.rglob("*")):
        if path.is_dir() and path.name == "d":
            shutil.rmtree(path)
    run = setup_lib.build(config, tmp_path)
    ckpt = Checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING):
        state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    assert int(jax.device_get(state.step)) == 20
    assert any(str(latest) in r.getMessage() for r in caplog.records)
    # Moved aside with its files, not deleted.
    aside = tmp_path / "checkpoints_unreadable" / "30"
    assert not latest.exists() and aside.is_dir() and any(aside.rglob("*"))
    # Resuming retrains steps 21..30 and saves step 30 again, readable this time.
    loop.train_and_evaluate(config, tmp_path)
    assert latest.is_dir()
    ckpt = Checkpointer(tmp_path)
    state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    assert int(jax.device_get(state.step)) == 30


@pytest.mark.long
def test_sigint_checkpoints_says_one_line_exits_130_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    args = (
        "--config.num_steps=1000",
        "--config.checkpoint_every=100",
        "--config.log_every=10",
        "--config.shifts.corruptions=none",
    )
    proc = subprocess.Popen(
        _cli.command("digits_ce.py", workdir, *args),
        cwd=_cli.ROOT,
        env=_cli.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Ctrl-C once the first regular checkpoint is complete.
    while not _kill.finished_steps(workdir / "checkpoints"):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-2000:]
    steps = _kill.finished_steps(workdir / "checkpoints")
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupted")]
    assert lines == [
        f"interrupted: saved step {steps[-1]} in {workdir}; rerun the same "
        "command to resume."
    ]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert 100 <= steps[-1] < 1000
    leftovers = [p.name for p in (workdir / "checkpoints").iterdir()]
    assert not [name for name in leftovers if "tmp" in name], leftovers
    result = _cli.run("digits_ce.py", workdir, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    # It resumed from the saved step (a restart would log step 10 again).
    logged = [r["step"] for r in metrics_log.load_jsonl(workdir / "metrics.jsonl")]
    train = [s for s in logged if s % 10 == 0]
    assert train.count(10) == 1 and logged.count(1000) == 2  # training, final eval
