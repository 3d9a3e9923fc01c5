"""Runs ``python -m calib_jax.train`` in a subprocess (own JAX runtime, own devices)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env(num_devices: int = 1) -> dict[str, str]:
    e = dict(os.environ)
    e["JAX_PLATFORMS"] = "cpu"
    e["JAX_NUM_CPU_DEVICES"] = str(num_devices)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("XLA_FLAGS", None)
    return e


def command(config: str, workdir, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "calib_jax.train",
        f"--config={ROOT / 'configs' / config}",
        f"--workdir={workdir}",
        *overrides,
    ]


def run(
    config: str, workdir, *overrides: str, num_devices: int = 1, timeout: float = 1800
):
    return subprocess.run(
        command(config, workdir, *overrides),
        cwd=ROOT,
        env=env(num_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
