"""Kills a command-line run with SIGKILL once its metrics log reaches a step."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path


def logged_steps(path: Path) -> list[int]:
    """Steps of the whole records of a metrics.jsonl file (a torn last line skipped)."""
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            steps.append(json.loads(line)["step"])
    return steps


def finished_steps(checkpoints: Path) -> list[int]:
    """Steps of the finished checkpoints in a ``checkpoints`` directory."""
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())


def kill_at_step(
    command: list[str],
    metrics: Path,
    step: int,
    *,
    cwd,
    env,
    checkpoint: int | None = None,
    timeout: float = 900,
) -> str:
    """Runs ``command`` and SIGKILLs it once ``metrics`` logs ``step`` or later.

    With ``checkpoint``, it also waits for a finished checkpoint of that step
    or a later one (in the ``checkpoints`` directory beside ``metrics``).

    Returns:
      The run's stderr.

    Raises:
      AssertionError: the run ended (or timed out) before it logged ``step``.
    """
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
        deadline = time.monotonic() + timeout
        try:
            ckpts = metrics.parent / "checkpoints"
            while not (
                any(s >= step for s in logged_steps(metrics))
                and (
                    checkpoint is None
                    or any(c >= checkpoint for c in finished_steps(ckpts))
                )
            ):
                assert proc.poll() is None, f"the run ended before step {step}"
                assert time.monotonic() < deadline, f"no step {step} in {timeout} s"
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return err.read()
