"""A run SIGKILLed, its newest checkpoint damaged on disk, then resumed.

The damage is what a crash during a write or a bad disk leaves: a truncated
array file, one flipped bit in an array file, a garbled or missing metadata
file, a missing checksum record. Each resume sets the damaged step aside with one
line, restores the previous step and ends bit for bit where an uninterrupted
run ends; its metrics.jsonl has every record once.
"""

from __future__ import annotations

import collections
import json
import shutil

import numpy as np
import pytest

import _cli
import _kill

ARGS = (
    "--config.num_steps=400",
    "--config.checkpoint_every=20",
    "--config.log_every=1",
    "--config.shifts.corruptions=none",
)
KILL_AT = 50  # checkpoints 20 and 40 are done, steps 41..50+ are logged
# (400 steps leave a few seconds to kill the run in before it ends.)


def _largest_array_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    data = [p for p in files if p.parent.name == "d"]
    return max(data, key=lambda p: p.stat().st_size)


def _truncate(step_dir):
    path = _largest_array_file(step_dir)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_bit(step_dir):
    path = _largest_array_file(step_dir)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _garble_metadata(step_dir):
    path = step_dir / "state" / "_METADATA"
    path.write_bytes(path.read_bytes()[:40] + b"\x00garbled")


def _drop_metadata(step_dir):
    (step_dir / "state" / "_METADATA").unlink()


def _drop_checksums(step_dir):
    (step_dir / "checksums" / "metadata").unlink()


DAMAGE = {
    "truncated": _truncate,
    "bit_flip": _flip_bit,
    "garbled_metadata": _garble_metadata,
    "missing_metadata": _drop_metadata,
    "missing_checksums": _drop_checksums,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and one SIGKILLed after step ``KILL_AT``."""
    root = tmp_path_factory.mktemp("damage")
    straight, killed = root / "straight", root / "killed"
    result = _cli.run("digits_ce.py", straight, *ARGS)
    assert result.returncode == 0, result.stderr[-2000:]
    _kill.kill_at_step(
        _cli.command("digits_ce.py", killed, *ARGS),
        killed / "metrics.jsonl",
        KILL_AT,
        checkpoint=40,
        cwd=_cli.ROOT,
        env=_cli.env(),
    )
    return straight, killed


def _steps(workdir):
    return _kill.finished_steps(workdir / "checkpoints")


def _logits(workdir):
    with np.load(workdir / "logits" / "test.npz") as f:
        return f["logits"]


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_and_resumes_bit_exactly(
    runs, tmp_path, damage
):
    straight, killed = runs
    workdir = tmp_path / "w"
    shutil.copytree(killed, workdir)
    steps = _steps(workdir)
    assert len(steps) >= 2 and steps[-1] < 400, steps  # it really was killed
    newest, previous = steps[-1], steps[-2]
    DAMAGE[damage](workdir / "checkpoints" / str(newest))

    result = _cli.run("digits_ce.py", workdir, *ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "is damaged" in line]
    assert len(said) == 1, result.stderr[-3000:]
    assert f"checkpoints/{newest} is damaged" in said[0]
    assert f"resuming from step {previous}" in said[0]
    assert "Traceback" not in result.stderr
    # Set aside, whole, and saved again when training came back to it.
    assert (workdir / "checkpoints_unreadable" / str(newest) / "state").is_dir()
    np.testing.assert_array_equal(_logits(workdir), _logits(straight))
    # Every record once, in the order of an uninterrupted run.
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    keys = [(r["step"], tuple(sorted(set(r) - {"time"}))) for r in rows]
    repeated = [k for k, n in collections.Counter(keys).items() if n > 1]
    assert not repeated, repeated[:3]
    straight_rows = [
        json.loads(line)
        for line in (straight / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [r["step"] for r in straight_rows]
    for a, b in zip(rows, straight_rows, strict=True):
        assert {
            k: v for k, v in a.items() if k not in ("time", "train/input_wait_fraction")
        } == {
            k: v for k, v in b.items() if k not in ("time", "train/input_wait_fraction")
        }
