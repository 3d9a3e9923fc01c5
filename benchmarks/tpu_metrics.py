"""Metric kernels on TPU: bytes accessed against the bytes of their input.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python benchmarks/tpu_metrics.py`` (needs
libtpu, as ``benchmarks/tpu_kernels.py``; no TPU is used; the sorts of
``adaptive_ece`` and ``aurc`` take minutes to compile). Every public metric
of issue 21 is jitted with kernels ``'auto'`` (what a TPU runs: the
``tpu`` entries of ``calib_jax.kernels.FAMILIES``) and compiled ahead of time
for one chip of a TPU v5e at (N, K) = (1e6, 10) and (1e5, 1000); XLA's cost
analysis of the compiled program gives the bytes accessed, compared with the
input: probabilities + labels as they sit on the chip (the compiled
program's argument bytes, in the TPU's tiled layout: a ``[N, 10]`` float32
array is stored as ``[N, 16]``), and, for reference, their logical bytes
``4 N (K + 1)``. Target: at most 3x the input on the chip. Writes the section
"Metric kernels on TPU: bytes accessed vs input" of benchmarks/RESULTS.md
(``--no-write`` prints only; ``--only ece,aurc`` measures some metrics).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp
import tpu_kernels
from _timing import write_section

from calib_jax import metrics

TITLE = "Metric kernels on TPU: bytes accessed vs input"
TARGET = 3.0
SIZES = ((1_000_000, 10), (100_000, 1000))
METRICS = {
    "ece": metrics.ece,
    "adaptive_ece": metrics.adaptive_ece,
    "classwise_ece": metrics.classwise_ece,
    "smooth_ece": metrics.smooth_ece,
    "aurc": metrics.aurc,
    "BinnedStats.from_batch": lambda p, y: metrics.BinnedStats.from_batch(p, y),
    "BinnedStats.from_batch (classwise)": lambda p, y: metrics.BinnedStats.from_batch(
        p, y, classwise=True
    ),
}


def measure(names, device) -> list[dict]:
    """One row per metric and size."""
    out = []
    for name in names:
        for n, k in SIZES:
            specs = [((n, k), jnp.float32), ((n,), jnp.int32)]
            start = time.perf_counter()
            cost = tpu_kernels.compile_cost(METRICS[name], specs, device)
            logical = 4.0 * n * k + 4.0 * n
            nan = float("nan")
            on_chip = cost["argument_bytes"] if cost["ok"] else nan
            ratio = cost["bytes"] / on_chip if cost["ok"] else nan
            out.append(
                {
                    "metric": name,
                    "n": n,
                    "k": k,
                    "input": on_chip,
                    "logical": logical,
                    "ratio": ratio,
                    "logical_ratio": cost["bytes"] / logical if cost["ok"] else nan,
                }
                | cost
            )
            print(
                f"{name:36s} {n:>9,} x {k:<5} {ratio:7.2f}x "
                f"({time.perf_counter() - start:.0f} s) {cost['error']}",
                flush=True,
            )
    return out


def report(rows: list[dict], device) -> str:
    lines = [
        f"Target: {device.device_kind} (topology `{tpu_kernels.TOPOLOGY}`, one "
        "chip), compiled ahead of time on a CPU host (no TPU run).",
        "",
        "Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/tpu_metrics.py`",
        "",
        "Each public metric jitted with kernels `'auto'` (the `tpu` entries of "
        "`calib_jax.kernels.FAMILIES`, as a TPU runs it), float32 probabilities "
        "and int32 labels; bytes accessed from XLA's cost analysis of the "
        "compiled program (a while loop's body counted once: the bisection of "
        "`smooth_ece` and the binary searches). Input = probabilities + "
        "labels as the chip holds them (the compiled program's argument bytes, "
        "in the TPU's tiled layout: `[N, 10]` float32 is stored as `[N, 16]`); "
        "logical = `4 N (K + 1)` bytes. Target: at most "
        f"{TARGET:g}x the input on the chip.",
        "",
        "| metric | N x K | input on chip MB | logical MB | GB accessed | "
        "ratio (on chip) | ratio (logical) | target | met? |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        gb = f"{r['bytes'] / 1e9:.3f}" if r["ok"] else "fails"
        met = "yes" if r["ratio"] <= TARGET else "no"
        lines.append(
            f"| {r['metric']} | {r['n']:,} x {r['k']} | {r['input'] / 1e6:.0f} | "
            f"{r['logical'] / 1e6:.0f} | {gb} | {r['ratio']:.2f}x | "
            f"{r['logical_ratio']:.2f}x | <= {TARGET:g}x | {met} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated metrics")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    names = [m for m in args.only.split(",") if m] or list(METRICS)
    for name in names:
        if name not in METRICS:
            raise SystemExit(
                f"--only: unknown metric {name!r}; known: {', '.join(METRICS)}."
            )
    device = tpu_kernels.tpu_device()
    rows = measure(names, device)
    body = report(rows, device)
    print(body)
    if not (args.no_write or args.only):
        write_section(TITLE, body)
    return 0 if all(r["ratio"] <= TARGET for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
