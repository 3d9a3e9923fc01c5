"""Tests that start several processes: a free local port for their
coordinator, and waiting for all of them under one deadline (a process still
running at the deadline, or after another's timeout, is killed)."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_all(
    procs: list[subprocess.Popen], timeout_s: float
) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of every process, in order, all
    within ``timeout_s`` seconds from now; none is left running."""
    deadline = time.time() + timeout_s
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.time()))
            out.append((proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out
