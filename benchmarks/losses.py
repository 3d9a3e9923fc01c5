"""Forward+backward cost of every loss relative to plain cross-entropy.

Run: ``.venv/bin/python benchmarks/losses.py`` (about 3 minutes on 2 cores).
Writes the ``## Losses`` section of benchmarks/RESULTS.md. Each entry is the
median time of ``jit(grad(mean loss))`` divided by the same for
``cross_entropy``, measured in one run on the same logits. Regularizers are
timed alone (the term a user adds to the primary loss).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _timing import machine_line, median_seconds, write_section  # noqa: E402
from calib_jax import losses  # noqa: E402

SIZES = ((512, 10), (4096, 100), (4096, 1000))
TARGET = 1.5
TARGET_SIZE = (4096, 1000)
EXEMPT = {"mmce"}  # quadratic in B by definition


def _fwd_bwd(name: str):
    fn = losses.get_loss(name)
    batch_level = name in losses.BATCH_LEVEL

    def objective(logits, labels):
        value = fn(logits, labels)
        return value if batch_level else jnp.mean(value)

    return jax.jit(jax.value_and_grad(objective))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    names = ["cross_entropy"] + sorted(n for n in losses.LOSSES if n != "cross_entropy")
    table = {}
    for b, k in SIZES:
        rng = np.random.default_rng(0)
        logits = jnp.asarray(rng.normal(scale=3.0, size=(b, k)).astype(np.float32))
        labels = jnp.asarray(rng.integers(0, k, size=b).astype(np.int32))
        times = {}
        for name in names:
            step = _fwd_bwd(name)
            times[name] = median_seconds(
                lambda: jax.block_until_ready(step(logits, labels))
            )
            print(
                f"B={b:5d} K={k:5d} {name:16s} {times[name] * 1e3:9.3f} ms", flush=True
            )
        table[(b, k)] = times

    header = "| loss | " + " | ".join(f"({b}, {k})" for b, k in SIZES) + " |"
    rule = "|---|" + "---:|" * len(SIZES)
    rows = []
    for name in names:
        cells = []
        for size in SIZES:
            ratio = table[size][name] / table[size]["cross_entropy"]
            cell = f"{ratio:.2f}x"
            if size == TARGET_SIZE and name not in EXEMPT and ratio > TARGET:
                cell += " (over target)"
            cells.append(cell)
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    ce_ms = " / ".join(f"{table[s]['cross_entropy'] * 1e3:.3f} ms" for s in SIZES)
    over = [
        n
        for n in names
        if n not in EXEMPT
        and table[TARGET_SIZE][n] / table[TARGET_SIZE]["cross_entropy"] > TARGET
    ]
    verdict = (
        "every loss except MMCE is within 1.5x of cross-entropy at (4096, 1000)."
        if not over
        else f"over the 1.5x target at (4096, 1000): {', '.join(over)}."
    )
    body = "\n".join(
        [
            "Forward+backward (`jit(value_and_grad(mean loss))`) time relative to "
            "`cross_entropy` on the same logits, median of 7 samples after compile, "
            "default hyperparameters. Regularizers are timed alone.",
            "",
            f"Machine: {machine_line()}. Command: `.venv/bin/python benchmarks/losses.py`.",
            f"Cross-entropy itself: {ce_ms}.",
            "",
            header,
            rule,
            *rows,
            "",
            f"Target (MMCE exempt, quadratic in B): {verdict}",
        ]
    )
    print(body)
    if not args.no_write:
        write_section("Losses", body)


if __name__ == "__main__":
    main()
