"""Forward+backward cost of every loss relative to plain cross-entropy.

Run: ``.venv/bin/python benchmarks/losses.py`` (about 5 minutes on 2 cores,
most of it CPC). Writes the ``## Losses`` section of benchmarks/RESULTS.md.
Each entry is the time of ``jit(value_and_grad(mean loss))`` divided by the
same for ``cross_entropy`` on the same logits. Regularizers are timed alone
(the term a user adds to the primary loss).

Timing is robust to load from other processes: every sample of a loss is
paired with a cross-entropy sample taken just before it, the pairs of all the
losses are interleaved round by round, and the reported ratio is the median
over the rounds of the per-pair ratios. ``--only focal,brier`` times a subset
(cross-entropy is always included) and prints without writing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax
import jax.numpy as jnp
import numpy as np
from _timing import machine_line, write_section

from calib_jax import losses

SIZES = ((512, 10), (4096, 100), (4096, 1000))
TARGET = 1.5
TARGET_SIZE = (4096, 1000)
# Exempt from the target, with the reason (quadratic by definition).
EXEMPT = {
    "mmce": "quadratic in B: a kernel sum over all pairs of samples",
    "cpc": (
        "quadratic in K: a sum of log-sigmoids over all ordered pairs of "
        "non-true classes, which has no exact O(BK) form"
    ),
}
# A loss slower than this (seconds per call) gets fewer rounds.
_SLOW = 1.0


def _fwd_bwd(name: str):
    fn = losses.get_loss(name)
    batch_level = name in losses.BATCH_LEVEL

    def objective(logits, labels):
        value = fn(logits, labels)
        return value if batch_level else jnp.mean(value)

    return jax.jit(jax.value_and_grad(objective))


def _sample(call, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return (time.perf_counter() - start) / inner


def time_size(names, b, k, *, rounds, min_time, log=print):
    """``{name: (median seconds, median ratio to cross_entropy)}`` at (b, k)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(scale=3.0, size=(b, k)).astype(np.float32))
    labels = jnp.asarray(rng.integers(0, k, size=b).astype(np.int32))
    calls, inner = {}, {}
    for name in ["cross_entropy", *names]:
        step = _fwd_bwd(name)

        def call(step=step):
            return jax.block_until_ready(step(logits, labels))

        call()  # compile
        start = time.perf_counter()
        call()
        once = max(time.perf_counter() - start, 1e-6)
        calls[name], inner[name] = call, max(1, int(min_time / once))
    slow = {n for n in names if _sample(calls[n], 1) > _SLOW}
    times = {n: [] for n in names}
    ratios = {n: [] for n in names}
    ce_times = []
    for r in range(rounds):
        for name in names:
            if name in slow and r >= 3:
                continue
            ce = _sample(calls["cross_entropy"], inner["cross_entropy"])
            t = _sample(calls[name], inner[name])
            ce_times.append(ce)
            times[name].append(t)
            ratios[name].append(t / ce)
    out = {"cross_entropy": (statistics.median(ce_times), 1.0)}
    for name in names:
        out[name] = (statistics.median(times[name]), statistics.median(ratios[name]))
        log(
            f"B={b:5d} K={k:5d} {name:16s} {out[name][0] * 1e3:10.3f} ms "
            f"{out[name][1]:9.2f}x"
        )
    return out


def _cell(size, name, ratio):
    cell = f"{ratio:.2f}x"
    if size == TARGET_SIZE and name not in EXEMPT and ratio > TARGET:
        cell += " (over target)"
    return cell


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--only", default="", help="comma-separated loss names (implies --no-write)"
    )
    parser.add_argument(
        "--sizes", default="", help="e.g. 4096x1000,512x10 (implies --no-write)"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.1)
    parser.add_argument("--load", default="", help="a note on the machine load")
    args = parser.parse_args(argv)
    all_names = sorted(n for n in losses.LOSSES if n != "cross_entropy")
    names = [n for n in args.only.split(",") if n] or all_names
    unknown = set(names) - set(losses.LOSSES)
    if unknown:
        parser.error(f"unknown losses: {sorted(unknown)}")
    names = [n for n in names if n != "cross_entropy"]
    sizes = SIZES
    if args.sizes:
        sizes = tuple(
            tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")
        )
    write = not (args.no_write or args.only or args.sizes)

    table = {
        (b, k): time_size(names, b, k, rounds=args.rounds, min_time=args.min_time)
        for b, k in sizes
    }
    rows_names = ["cross_entropy", *names]
    header = "| loss | " + " | ".join(f"({b}, {k})" for b, k in sizes) + " |"
    rule = "|---|" + "---:|" * len(sizes)
    rows = [
        f"| {name} | "
        + " | ".join(_cell(s, name, table[s][name][1]) for s in sizes)
        + " |"
        for name in rows_names
    ]
    ce_ms = " / ".join(f"{table[s]['cross_entropy'][0] * 1e3:.3f} ms" for s in sizes)
    lines = []
    if TARGET_SIZE in table:
        over = [
            n for n in names if n not in EXEMPT and table[TARGET_SIZE][n][1] > TARGET
        ]
        exempt = "; ".join(f"{n}: {why}" for n, why in sorted(EXEMPT.items()))
        verdict = (
            f"every loss except {', '.join(sorted(EXEMPT))} is within "
            f"{TARGET}x of cross-entropy at {TARGET_SIZE}."
            if not over
            else f"over the {TARGET}x target at {TARGET_SIZE}: {', '.join(over)}."
        )
        lines = [f"Target: {verdict} Exempt ({exempt})."]
    load = f" Load: {args.load}." if args.load else ""
    body = "\n".join(
        [
            (
                "Forward+backward (`jit(value_and_grad(mean loss))`) time relative "
                "to `cross_entropy` on the same logits (normal, scale 3), default "
                "hyperparameters; regularizers are timed alone. Each ratio is the "
                f"median over {args.rounds} interleaved rounds of (loss time / "
                "cross-entropy time measured just before it); losses slower than "
                f"{_SLOW:.0f} s per call get 3 rounds."
            ),
            "",
            (
                f"Machine: {machine_line()}.{load} "
                "Command: `.venv/bin/python benchmarks/losses.py`."
            ),
            f"Cross-entropy itself (median): {ce_ms}.",
            "",
            header,
            rule,
            *rows,
            "",
            *lines,
        ]
    )
    print(body)
    if write:
        write_section("Losses", body)


if __name__ == "__main__":
    main()
