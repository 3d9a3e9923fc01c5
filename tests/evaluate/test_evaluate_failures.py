"""``python -m calib_jax.evaluate`` on a damaged logits file and under Ctrl-C:
one line on stderr, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calib_jax import evaluate

ROOT = Path(__file__).resolve().parents[2]
# The command, with calib_jax.evaluate._run.run replaced by one that raises
# KeyboardInterrupt as Ctrl-C does (the command imports it after parsing).
_INTERRUPTED = """
import sys
from calib_jax.evaluate import _run

def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

_run.run = interrupted
sys.argv = ["evaluate", *sys.argv[1:]]
from calib_jax.evaluate.__main__ import run
run()
"""


def _run_with_logits(root: Path) -> Path:
    """A workdir holding only exported val and test logits."""
    rng = np.random.default_rng(0)
    (root / "logits").mkdir(parents=True)
    for key in ("val", "test"):
        z = rng.normal(size=(40, 10)).astype(np.float32)
        y = rng.integers(0, 10, 40).astype(np.int32)
        np.savez(root / "logits" / f"{key}.npz", logits=z, labels=y)
    return root


def _config():
    from configs import digits_ce

    config = digits_ce.get_config()
    config.shifts.corruptions = "none"
    return config


def _command(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _flags(run: Path) -> list[str]:
    return [
        f"--config={ROOT / 'configs' / 'digits_ce.py'}",
        "--config.shifts.corruptions=none",
        f"--workdir={run}",
        "--from_logits",
    ]


def test_truncated_logits_are_named_in_one_line(tmp_path):
    run = _run_with_logits(tmp_path / "run")
    test = run / "logits" / "test.npz"
    test.write_bytes(test.read_bytes()[:100])
    with pytest.raises(ValueError) as err:
        evaluate.run(_config(), run, from_logits=True, progress=False)
    assert str(err.value) == (
        f"{test} is not an .npz archive (np.savez output): it is truncated or of "
        "another format."
    )
    assert not (run / "evaluate").exists()

    proc = _command("-m", "calib_jax.evaluate", *_flags(run))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: {test} is not an .npz archive" in proc.stderr
    assert not (run / "evaluate").exists()


def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    run = _run_with_logits(tmp_path / "run")
    proc = _command("-c", _INTERRUPTED, *_flags(run))
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "interrupted"
    assert proc.stdout == ""
    assert not (run / "evaluate").exists()
