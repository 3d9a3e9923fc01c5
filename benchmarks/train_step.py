"""Train-step time of cross-entropy alone vs cross-entropy + each calibration loss.

Run: ``.venv/bin/python benchmarks/train_step.py [--model resnet20] [--batch 128]``
(about 10 minutes on 2 CPU cores: one compile per objective). Writes the
``## Train step`` section of benchmarks/RESULTS.md: the median time of the full
jitted step (forward, loss, backward, SGD update, BatchNorm statistics) on
random 32x32x3 data, as a ratio to the cross-entropy step, in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from _timing import machine_line, write_section  # noqa: E402
from calib_jax import losses, models  # noqa: E402
from calib_jax.train import step as step_lib  # noqa: E402
from calib_jax.train.state import create  # noqa: E402
from configs.common import OBJECTIVES  # noqa: E402

TARGET = 1.05


def _step_runner(model, terms, images, labels, dtype):
    """A compiled, warmed-up ``run()`` doing one train step and blocking on it."""
    tx = optax.chain(optax.add_decayed_weights(5e-4), optax.sgd(0.1, momentum=0.9))
    state = jax.jit(lambda r: create(model, tx, r, images[:1]))(jax.random.key(0))
    step = jax.jit(
        step_lib.make_train_step(
            step_lib.model_forward(model), losses.composite(terms), tx
        ),
        donate_argnums=0,
    )
    batch = {
        "image": images.astype(dtype),
        "label": labels,
        "mask": jnp.ones(labels.shape, bool),
    }
    holder = [state]

    def run():
        holder[0], metrics = step(holder[0], batch)
        jax.block_until_ready(metrics["loss/total"])

    run()  # compile
    run()
    return run


def interleaved_medians(runners: dict, *, rounds: int, per_sample: int) -> dict:
    """Median step time of each runner over ``rounds`` interleaved rounds.

    Every round times ``per_sample`` steps of each objective in turn, so a
    change of machine load during the run affects all objectives alike.
    """
    samples = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            for _ in range(per_sample):
                run()
            samples[name].append((time.perf_counter() - start) / per_sample)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    model = models.get_model(args.model, num_classes=10, dtype=args.dtype)
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.random((args.batch, 32, 32, 3), dtype=np.float32))
    labels = jnp.asarray(rng.integers(0, 10, args.batch).astype(np.int32))
    names = ["ce"] + [n for n in args.objectives.split(",") if n != "ce"]
    runners = {}
    for name in names:
        runners[name] = _step_runner(
            model, OBJECTIVES[name], images, labels, args.dtype
        )
        print(f"compiled {name}", flush=True)
    times = interleaved_medians(runners, rounds=args.rounds, per_sample=3)
    for name in names:
        print(f"{name:14s} {times[name] * 1e3:9.1f} ms/step", flush=True)
    base = times["ce"]
    rows = []
    for name in names:
        terms = " + ".join(t["name"] for t in OBJECTIVES[name])
        ratio = times[name] / base
        mark = "" if ratio <= TARGET or name == "ce" else " (over 5%)"
        rows.append(
            f"| {name} | {terms} | {times[name] * 1e3:.1f} | {ratio:.3f}x{mark} |"
        )
    over = [n for n in names if times[n] / base > TARGET and n not in ("ce", "mmce")]
    body = "\n".join(
        [
            f"Full jitted train step of {args.model}, batch {args.batch}, random "
            f"32x32x3 images, {args.dtype}, SGD momentum + L2; median over "
            f"{args.rounds} interleaved rounds (3 steps of every objective in turn "
            "each round) after compile, in one run.",
            "",
            f"Machine: {machine_line()}. Command: "
            f"`.venv/bin/python benchmarks/train_step.py --model {args.model} "
            f"--batch {args.batch}`.",
            "",
            "| objective | terms | ms/step | vs cross-entropy |",
            "|---|---|---:|---:|",
            *rows,
            "",
            "Target (each calibration loss adds at most 5%): "
            + (
                "met for every objective."
                if not over
                else f"over for {', '.join(over)}."
            ),
        ]
    )
    print(body)
    if not args.no_write:
        write_section("Train step", body)


if __name__ == "__main__":
    main()
