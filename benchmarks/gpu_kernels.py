"""Tuned vs plain kernel formulations timed on a GPU (the switch's GPU column).

Run on a machine with a GPU: ``python benchmarks/gpu_kernels.py [--out FILE]``.
Every case of ``benchmarks/tpu_kernels.py`` (the same functions and sizes) is
jitted twice, once with ``calib_jax.kernels.use('tuned', family)`` and once
with ``'plain'``, on random inputs of its shapes, and timed (median of 7
samples after the compile, ``jax.block_until_ready``). Writes the section
"Kernel portability on <device> (measured)" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tpu_kernels  # noqa: E402
from _timing import machine_line, median_seconds, write_section  # noqa: E402

from calib_jax import kernels  # noqa: E402


def make_inputs(specs, seed: int = 0) -> list[jax.Array]:
    """Random arrays of ``(shape, dtype)`` specs: logits, scores in [0, 1),
    ids in [0, 10) (valid labels and bins alike), masks, temperature 1."""
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in specs:
        if dtype == jnp.int32:
            out.append(rng.integers(0, 10, shape).astype(np.int32))
        elif dtype == jnp.bool_:
            out.append(rng.random(shape) < 0.9)
        elif shape == ():
            out.append(np.float32(1.0))
        elif len(shape) == 1:
            out.append(rng.random(shape, dtype=np.float32))
        else:
            out.append(rng.normal(size=shape).astype(np.float32))
    return [jnp.asarray(x) for x in out]


def time_case(case) -> dict:
    """Seconds per call of the tuned and the plain formulation of ``case``."""
    args = make_inputs(case.specs(case.rows))
    row = {"family": case.family, "case": case.label}
    for mode in ("tuned", "plain"):
        with kernels.use(mode, case.family):
            fn = jax.jit(case.fn)
            row[mode] = median_seconds(lambda: jax.block_until_ready(fn(*args)))
    row["ratio"] = row["tuned"] / row["plain"]
    return row


def render(rows: list[dict], device_kind: str, machine: str) -> str:
    """The RESULTS.md section: both times per case and each switch column."""
    worst: dict[str, float] = {}
    for r in rows:
        worst[r["family"]] = max(worst.get(r["family"], 0.0), r["ratio"])
    table = [
        "| family | case | tuned ms | plain ms | tuned / plain | GPU runs | TPU runs |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['family']} | {r['case']} | {r['tuned'] * 1e3:.3f} | "
            f"{r['plain'] * 1e3:.3f} | {r['ratio']:.2f}x | "
            f"{kernels.FAMILIES[r['family']].gpu} | {kernels.FAMILIES[r['family']].tpu} |"
        )
    return "\n".join(
        [
            "Every case of `benchmarks/tpu_kernels.py`, both formulations jitted "
            f"and timed on {device_kind} (median of 7 samples after the "
            f"compile). Machine: {machine}. Command: "
            "`python benchmarks/gpu_kernels.py`.",
            "",
            *table,
            "",
            "`GPU runs` is the family's `gpu` entry in `calib_jax.kernels.FAMILIES`: the plain formulation where "
            "the tuned one took over 1.15x its time at the family's largest "
            "size here, else the tuned one. Below about 0.2 ms both are bound "
            "by kernel launches, and differences of a few percent are noise. "
            "`TPU runs` (its `tpu` entry) comes from the TPU compile's bytes "
            "accessed (section above); the two columns differ for "
            + ", ".join(
                sorted(
                    f
                    for f in worst
                    if kernels.FAMILIES[f].gpu != kernels.FAMILIES[f].tpu
                )
            )
            + ".",
        ]
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    rows = []
    for case in tpu_kernels.cases():
        rows.append(time_case(case))
        r = rows[-1]
        print(
            f"{r['family']:24s} {r['case'][:56]:56s} tuned {r['tuned'] * 1e3:9.3f} "
            f"ms  plain {r['plain'] * 1e3:9.3f} ms  {r['ratio']:6.2f}x",
            flush=True,
        )
    body = render(rows, device.device_kind, machine_line())
    print(body)
    title = f"Kernel portability on {device.device_kind} (measured)"
    if args.out:
        Path(args.out).write_text(f"## {title}\n{body}\n")
    if not args.no_write:
        write_section(title, body)


if __name__ == "__main__":
    main()
