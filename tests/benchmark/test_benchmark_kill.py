"""A benchmark SIGKILLed while a cell trains, then rerun.

Three kill times (drawn from three seeds) inside the second cell's training.
The rerun reads the first cell back (its files untouched), resumes the second
from its last checkpoint (the records up to it are the killed run's, each
record once), and writes a results.jsonl byte-identical to an uninterrupted
run's.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import _kill

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 240, 20  # a few seconds of training to kill a cell in
ARGS = (
    f"--config={ROOT / 'configs' / 'benchmark_digits.py'}:quick",
    "--config.methods=('ce',)",
    "--config.calibrators=('none','ts:nll')",
    "--config.seeds=(0,1)",
    f"--config.train.num_steps={STEPS}",
    f"--config.train.checkpoint_every={EVERY}",
    "--config.train.log_every=1",
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


def _run(workdir):
    result = subprocess.run(
        _command(workdir),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bench_straight")
    _run(workdir)
    return workdir


def _files(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in directory.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_inside_a_cell_resumes_it_and_results_are_identical(
    uninterrupted, tmp_path, seed
):
    kill_at = int(np.random.default_rng(seed).integers(EVERY + 5, STEPS // 2))
    workdir = tmp_path / "w"
    cell = workdir / "cells" / "ce" / "seed1" / "train"
    _kill.kill_at_step(
        _command(workdir),
        cell / "metrics.jsonl",
        kill_at,
        checkpoint=kill_at // EVERY * EVERY,
        cwd=ROOT,
        env=_env(),
        timeout=1800,
    )
    first = workdir / "cells" / "ce" / "seed0"
    assert (first / "rows.jsonl").exists()
    assert not (workdir / "cells" / "ce" / "seed1" / "rows.jsonl").exists()
    assert not (workdir / "results.jsonl").exists()
    checkpoints = _kill.finished_steps(cell / "checkpoints")
    assert checkpoints and checkpoints[-1] < STEPS, checkpoints
    before = _files(first)

    started = time.time()
    _run(workdir)
    assert (workdir / "results.jsonl").read_bytes() == (
        uninterrupted / "results.jsonl"
    ).read_bytes()
    assert _files(first) == before  # the finished cell was read back, not redone
    rows = [json.loads(line) for line in (cell / "metrics.jsonl").open()]
    kinds = collections.Counter((r["step"], tuple(sorted(r))) for r in rows)
    assert max(kinds.values()) == 1
    train = [r for r in rows if "loss/total" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    # Steps up to the restored checkpoint were not trained again.
    resumed_from = min(r["step"] for r in train if r["time"] >= started) - 1
    assert resumed_from == checkpoints[-1], (resumed_from, checkpoints)
