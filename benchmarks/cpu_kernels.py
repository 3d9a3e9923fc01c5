"""Tuned vs plain: every kernel family of :mod:`calib_jax.kernels` timed on the CPU.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python benchmarks/cpu_kernels.py``. Each
case of ``benchmarks/tpu_kernels.py`` (the benchmark sizes) plus the sizes the
digits demo runs (``make demo``: batch 128 x 10 classes in training, a few
thousand rows x 10 classes in evaluation) is jitted once forced to ``'tuned'``
and once to ``'plain'`` (``kernels.use(mode, family)``) and timed, the two
forms interleaved (``rounds`` rounds; the median ratio is reported). A family
is kept as a CPU kernel only when it is at least ``KEEP`` times faster than
its plain form at some size users run; the section "Kernel families: tuned vs
plain on the CPU" of benchmarks/RESULTS.md records the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
import tpu_kernels
from _timing import machine_line, write_section

from calib_jax import kernels

TITLE = "Kernel families: tuned vs plain on the CPU"
KEEP = 1.5


def demo_cases() -> list[tpu_kernels.Case]:
    """The kernels at the sizes of the digits demo."""
    out = []
    for case in tpu_kernels.cases():
        label = case.label
        if "1000" in label and ("B x K" in label or "N x K" in label):
            continue
        n = {"sort_keys": 2000, "posthoc_temperature": 2000}.get(case.family)
        if case.family.startswith("metric_"):
            n = 2000
        if case.family.startswith("loss_"):
            continue  # the 128 x 10 loss cases of tpu_kernels are the demo's
        if n is None or case.rows == n:
            continue
        out.append(
            tpu_kernels.Case(
                case.family,
                _resize(label, case.rows, n),
                case.fn,
                case.specs,
                n,
            )
        )
    return out


def _resize(label: str, old: int, new: int) -> str:
    return label.replace(f"{old:,}", f"{new:,}")


def _inputs(case: tpu_kernels.Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    args = []
    for shape, dtype in case.specs(case.rows):
        if dtype == jnp.bool_:
            args.append(jnp.asarray(rng.random(shape) < 0.7))
        elif jnp.issubdtype(dtype, jnp.integer):
            k = case.specs(case.rows)[0][0][-1]
            args.append(jnp.asarray(rng.integers(0, k, shape), dtype))
        elif len(shape) == 2:
            z = 3.0 * rng.standard_normal(shape)
            if case.family.startswith("metric_"):  # probabilities
                z = np.exp(z - z.max(-1, keepdims=True))
                z /= z.sum(-1, keepdims=True)
            args.append(jnp.asarray(z, dtype))
        elif len(shape) == 1:
            args.append(jnp.asarray(rng.random(shape), dtype))
        else:
            args.append(jnp.zeros(shape, dtype))
    return args


def _timer(fn, args, mode, family):
    with kernels.use(mode, family):
        jitted = jax.jit(fn)
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        compile_s = time.perf_counter() - start

    def once(inner):
        with kernels.use(mode, family):
            start = time.perf_counter()
            for _ in range(inner):
                jax.block_until_ready(jitted(*args))
            return (time.perf_counter() - start) / inner

    return once, compile_s


def measure(case: tpu_kernels.Case, rounds: int, min_time: float) -> dict:
    args = _inputs(case)
    timers = {}
    compile_s = {}
    for mode in ("tuned", "plain"):
        timers[mode], compile_s[mode] = _timer(case.fn, args, mode, case.family)
    inner = {m: max(1, int(min_time / max(timers[m](1), 1e-6))) for m in timers}
    ratios, times = [], {"tuned": [], "plain": []}
    for _ in range(rounds):
        t = timers["tuned"](inner["tuned"])
        p = timers["plain"](inner["plain"])
        times["tuned"].append(t)
        times["plain"].append(p)
        ratios.append(p / t)
    return {
        "family": case.family,
        "case": case.label,
        "tuned_ms": 1e3 * statistics.median(times["tuned"]),
        "plain_ms": 1e3 * statistics.median(times["plain"]),
        "speedup": statistics.median(ratios),
        "compile_tuned": compile_s["tuned"],
        "compile_plain": compile_s["plain"],
    }


def decisions(rows: list[dict]) -> dict[str, tuple[str, float]]:
    """Per family: ``('keep', best speed-up)`` or ``('delete', best)``."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        best = max(r["speedup"] for r in rows if r["family"] == family)
        out[family] = ("keep" if best >= KEEP else "delete", best)
    return out


def report(rows: list[dict], rounds: int) -> str:
    lines = [
        f"Machine: {machine_line()}. Command: "
        "`JAX_PLATFORMS=cpu .venv/bin/python benchmarks/cpu_kernels.py`.",
        "",
        "Each case jitted once per formulation (`kernels.use(mode, family)`), "
        f"the two timed interleaved over {rounds} rounds; `speed-up` is the "
        "median of plain time / tuned time. Sizes: the TPU table's benchmark "
        "sizes and the digits demo's (2,000 x 10 in evaluation, 128 x 10 in "
        f"training). A family is kept on the CPU when its best speed-up is at "
        f"least {KEEP}x.",
        "",
        "| family | case | tuned ms | plain ms | speed-up | compile s tuned / plain |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['case']} | {r['tuned_ms']:.3f} | "
            f"{r['plain_ms']:.3f} | {r['speedup']:.2f}x | "
            f"{r['compile_tuned']:.2f} / {r['compile_plain']:.2f} |"
        )
    lines += ["", "| family | best speed-up | decision |", "|---|---:|---|"]
    for family, (what, best) in decisions(rows).items():
        lines.append(f"| {family} | {best:.2f}x | {what} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated families")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min_time", type=float, default=0.1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    only = {f for f in args.only.split(",") if f}
    rows = []
    for case in tpu_kernels.cases() + demo_cases():
        if only and case.family not in only:
            continue
        rows.append(measure(case, args.rounds, args.min_time))
        r = rows[-1]
        print(
            f"{r['family']:24s} {r['case'][:60]:60s} {r['speedup']:6.2f}x "
            f"({r['tuned_ms']:.3f} / {r['plain_ms']:.3f} ms)",
            flush=True,
        )
    body = report(rows, args.rounds)
    print(body)
    if not (args.no_write or only):
        write_section(TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
