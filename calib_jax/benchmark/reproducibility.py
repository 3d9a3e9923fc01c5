"""What a benchmark's exact numbers depend on besides the code: the CPU and JAX.

The benchmark is deterministic on one machine (a rerun, at any load, writes
the same bytes), but XLA:CPU compiles for the host's instruction set and its
matrix kernels pick their blocking from the host's caches, so another CPU
model or another jaxlib may move the last bits of a training run, and 30
epochs can grow those into other numbers. The expected results kept in
``tests/benchmark/expected`` record the machine that produced them
(:func:`machine`), and a drift failure names both machines
(:func:`describe_difference`).
"""

from __future__ import annotations

import hashlib
import platform

import jax
import jaxlib

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


def describe_difference(recorded: dict) -> str:
    """One line on whether this machine is the one ``recorded`` describes.

    Args:
      recorded: a :func:`machine` result kept with expected numbers.
    """
    here = machine()
    differ = [k for k in sorted(recorded) if recorded.get(k) != here.get(k)]
    if not differ:
        return "this machine is the one that recorded the expected results."
    changes = ", ".join(f"{k} {recorded.get(k)!r} -> {here.get(k)!r}" for k in differ)
    return (
        f"the expected results were recorded on another machine ({changes}); "
        "XLA:CPU's last bits depend on the CPU and the jaxlib, so a "
        "difference here may come from the machine rather than the code: rerun "
        "`make update-expected` on the old code on this machine to tell."
    )
