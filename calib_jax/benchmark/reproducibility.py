"""What a benchmark's exact numbers depend on besides the code: the CPU and JAX.

The benchmark is deterministic on one machine (a rerun, at any load, writes
the same bytes), but XLA:CPU compiles for the host's instruction set and its
matrix kernels pick their blocking from the host's caches, so another CPU
model or another jaxlib may move the last bits of a training run, and 30
epochs can grow those into other numbers. The expected results kept in
``tests/benchmark/expected`` record the machine that produced them
(:func:`machine`), one recording per machine (:func:`recording_name`,
:func:`recordings`, :func:`recording_of`).
"""

from __future__ import annotations

import hashlib
import json
import platform

import jax
import jaxlib
from etils import epath

# Kept beside the expected rows.
MACHINE_FILE = "machine.json"


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = sorted(value.split())
    except OSError:
        pass
    return model, flags


def machine() -> dict:
    """The CPU model, a digest of its feature flags, and the JAX versions.

    Returns:
      ``{'cpu', 'cpu_flags_sha256', 'machine', 'jax', 'jaxlib'}``; the flags
      are hashed (a CPU lists over a hundred).
    """
    model, flags = _cpuinfo()
    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()
    return {
        "cpu": model,
        "cpu_flags_sha256": digest,
        "machine": platform.machine(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }


def recording_name(recorded: dict) -> str:
    """The folder name of the results ``recorded`` (a :func:`machine`) made.

    The first 12 hex digits of the CPU flags digest and the jaxlib version,
    e.g. ``'ecfefe0ffbf1-jaxlib-0.10.2'``.
    """
    return f"{recorded['cpu_flags_sha256'][:12]}-jaxlib-{recorded['jaxlib']}"


def recordings(root: epath.Path) -> dict[str, dict]:
    """``{folder: machine}`` of every recording kept under ``root``.

    A recording is a folder of ``root`` holding a :data:`MACHINE_FILE`; sorted
    by folder name.
    """
    out = {}
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        file = folder / MACHINE_FILE
        if folder.is_dir() and file.exists():
            out[folder.name] = json.loads(file.read_text())
    return out


def recording_of(root: epath.Path, here: dict | None = None) -> str | None:
    """The folder under ``root`` recorded on this machine (every field of
    :func:`machine` equal), or None when no kept recording is this machine's.
    """
    here = machine() if here is None else here
    return next((k for k, v in recordings(root).items() if v == here), None)
