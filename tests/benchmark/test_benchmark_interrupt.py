"""A benchmark stopped by Ctrl-C (SIGINT) or SIGTERM while a cell trains, then rerun.

The run saves the cell's checkpoint at the next step, prints one line and
exits (status 130 after SIGINT, 0 after SIGTERM, as the trainer); the cell is
not marked trained, and the rerun resumes it from that step (each training
record once) and finishes the benchmark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import _kill
from calib_jax.train import metrics_log

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 1000, 20
ARGS = (
    f"--config={ROOT / 'configs' / 'benchmark_digits.py'}:quick",
    "--config.methods=('ce',)",
    "--config.calibrators=('none',)",
    "--config.seeds=(0,)",
    f"--config.train.num_steps={STEPS}",
    f"--config.train.checkpoint_every={EVERY}",
    "--config.train.log_every=10",
    "--config.train.shifts.corruptions=none",
    "--config.bootstrap.num_samples=0",
)


def _command(workdir) -> list[str]:
    return [sys.executable, "-m", "calib_jax.benchmark", f"--workdir={workdir}", *ARGS]


def _env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    return env


def _said(signum, saved: int, train) -> str:
    if signum == signal.SIGINT:
        return (
            f"interrupted: saved step {saved} in {train}; rerun the same command "
            "to resume."
        )
    return (
        f"SIGTERM: saved ce seed 0 in {train} and stopped; rerun the same command "
        "to resume."
    )


@pytest.mark.long
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_in_a_cell_is_one_line_and_the_rerun_resumes(tmp_path, signum, status):
    workdir = tmp_path / "bench"
    train = workdir / "cells" / "ce" / "seed0" / "train"
    proc = subprocess.Popen(
        _command(workdir),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not _kill.finished_steps(train / "checkpoints"):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == status, err[-3000:]
    saved = _kill.finished_steps(train / "checkpoints")[-1]
    said = _said(signum, saved, train)
    assert [ln for ln in err.splitlines() if ln.startswith(said[:11])] == [said]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert EVERY <= saved < STEPS
    assert not (train / "TRAINED").exists()
    assert not (workdir / "results.jsonl").exists()
    rerun = subprocess.run(
        _command(workdir),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (workdir / "results.jsonl").exists()
    rows = [
        r for r in metrics_log.load_jsonl(train / "metrics.jsonl") if "loss/total" in r
    ]
    assert [r["step"] for r in rows] == list(range(10, STEPS + 1, 10))
    with open(train / "metrics.jsonl") as f:  # each record once in the file
        steps = [line.split(",", 1)[0] for line in f if '"loss/total"' in line]
    assert len(steps) == len(set(steps)) == STEPS // 10
