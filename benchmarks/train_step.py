"""Train-step time of cross-entropy alone vs cross-entropy + each calibration loss.

Run: ``.venv/bin/python benchmarks/train_step.py [--model resnet20] [--batch 128]``
(about 10 minutes on 2 CPU cores: one compile per objective). Writes the
``## Train step`` section of benchmarks/RESULTS.md: the median time of the full
jitted step (forward, loss, backward, SGD update, BatchNorm statistics) on
random 32x32x3 data, as a ratio to the cross-entropy step, in one run; the
model FLOPs per step (:func:`calib_jax.models.train_step_flops`), the achieved
model TFLOP/s and, on a chip of :data:`PEAK_BF16_FLOPS`, the MFU.
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

from _timing import machine_line, median_seconds, write_section  # noqa: E402
from calib_jax import losses, models  # noqa: E402
from calib_jax.train import step as step_lib  # noqa: E402
from calib_jax.train.state import create  # noqa: E402
from configs.common import OBJECTIVES  # noqa: E402

TARGET = 1.05  # step time with the terms / step time with cross-entropy


# Dense (no sparsity) bf16 matrix peak FLOP/s per chip, by ``device_kind``:
# the denominator of the MFU column. Sources: NVIDIA H100 Tensor Core GPU
# datasheet (H100 SXM: 989 TFLOP/s bf16 dense; the datasheet's 1,979 assumes
# 2:4 sparsity), NVIDIA H200 datasheet (same tensor cores as H100 SXM: 989),
# Cloud TPU documentation, system architecture of v5e (197 TFLOP/s bf16).
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
    "TPU v5 lite": 197e12,
}

# XLA's cost analysis counts a convolution that XLA emits itself (CPU, TPU)
# but not one it hands to a library (cuDNN on a GPU: 0.8 GFLOP reported for a
# ResNet-20 step at batch 128 that needs 31 GFLOP). Its bytes are reported
# only when its FLOPs reach this fraction of the model FLOPs.
COST_ANALYSIS_COVERAGE = 0.5


def _step_runner(model, terms, images, labels, dtype, costs=None):
    """A compiled, warmed-up ``run()`` doing one train step and blocking on it.

    ``costs``, if given, receives the compiled step's XLA cost analysis
    (``flops``, ``bytes accessed``).
    """
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
    if costs is not None:
        analysis = step.lower(state, batch).compile().cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        costs.update(analysis or {})

    def run():
        holder[0], metrics = step(holder[0], batch)
        jax.block_until_ready(metrics["loss/total"])

    run()  # compile
    run()
    return run


def _terms_time(terms, num_classes: int, batch: int) -> float:
    """Forward+backward time of the loss terms alone on ``[batch, K]`` logits.

    What adding the terms to a step can cost at most, beyond what XLA fuses
    away; robust to machine load in a way a difference of two full steps is
    not.
    """
    objective = losses.composite(terms)
    grad = jax.jit(jax.value_and_grad(lambda z, y: objective(z, y)[0]))
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(batch, num_classes)).astype(np.float32))
    labels = jnp.asarray(rng.integers(0, num_classes, batch).astype(np.int32))
    return median_seconds(lambda: jax.block_until_ready(grad(logits, labels)))


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
    parser.add_argument("--out", default="", help="also write the section here")
    args = parser.parse_args(argv)
    model = models.get_model(args.model, num_classes=10, dtype=args.dtype)
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.random((args.batch, 32, 32, 3), dtype=np.float32))
    labels = jnp.asarray(rng.integers(0, 10, args.batch).astype(np.int32))
    names = ["ce"] + [n for n in args.objectives.split(",") if n != "ce"]
    runners, costs = {}, {}
    for name in names:
        runners[name] = _step_runner(
            model,
            OBJECTIVES[name],
            images,
            labels,
            args.dtype,
            costs=costs if name == "ce" else None,
        )
        print(f"compiled {name}", flush=True)
    times = interleaved_medians(runners, rounds=args.rounds, per_sample=3)
    alone = {n: _terms_time(OBJECTIVES[n], 10, args.batch) for n in names}
    for name in names:
        print(
            f"{name:14s} {times[name] * 1e3:9.1f} ms/step, terms alone "
            f"{alone[name] * 1e6:8.1f} us",
            flush=True,
        )
    base = times["ce"]
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    step_flops = models.train_step_flops(model, (32, 32, 3), args.batch)
    peak = PEAK_BF16_FLOPS.get(device.device_kind)
    rows = []
    for name in names:
        terms = " + ".join(t["name"] for t in OBJECTIVES[name])
        ratio = times[name] / base
        extra = (alone[name] - alone["ce"]) / base
        achieved = step_flops / times[name]
        rows.append(
            f"| {name} | {terms} | {times[name] * 1e3:.2f} | "
            f"{args.batch / times[name]:,.0f} | {ratio:.3f}x | "
            f"{alone[name] * 1e6:.1f} | {100 * extra:+.3f}% | "
            f"{achieved / 1e12:.2f} |" + (f" {achieved / peak:.1%} |" if peak else "")
        )
    over = [n for n in names if (alone[n] - alone["ce"]) / base > TARGET - 1]
    xla_flops, moved = costs.get("flops", 0.0), costs.get("bytes accessed", 0.0)
    counted = xla_flops >= COST_ANALYSIS_COVERAGE * step_flops
    flops_line = (
        f"Model FLOPs per step: {step_flops / 1e9:.1f} GFLOP (`models.train_step_flops`: "
        f"3 x 2 x {step_flops / 6 / args.batch / 1e6:.2f} M multiply-adds per image "
        f"forward, counted from the convolution and dense shapes, x {args.batch}; "
        "forward + backward = 3 forward passes, the usual convention). "
        + (
            f"MFU = model FLOPs / step time / the dense bf16 peak of "
            f"{device.device_kind} ({peak / 1e12:.0f} TFLOP/s): "
            f"{step_flops / base / peak:.1%} for the cross-entropy step. "
            if peak
            else ""
        )
        + (
            f"XLA's cost analysis of the cross-entropy step on {device.platform} "
            f"counts the convolutions ({xla_flops / 1e9:.1f} GFLOP) and "
            f"{moved / 1e9:.2f} GB accessed."
            if counted
            else f"XLA's cost analysis on {device.platform} reports "
            f"{xla_flops / 1e9:.1f} GFLOP: it leaves out the convolutions run "
            "as library calls, so its bytes accessed are not reported."
        )
    )
    where = "" if on_cpu else f" on {device.device_kind}"
    body = "\n".join(
        [
            f"Full jitted train step of {args.model}{where}, batch {args.batch}, random "
            f"32x32x3 images, {args.dtype}, SGD momentum + L2; median over "
            f"{args.rounds} interleaved rounds (3 steps of every objective in turn "
            "each round) after compile, in one run.",
            "",
            f"Machine: {machine_line()}. Command: "
            f"`.venv/bin/python benchmarks/train_step.py --model {args.model} "
            f"--batch {args.batch} --dtype {args.dtype}`"
            + ("" if on_cpu else f" (device: {device.device_kind})")
            + ".",
            "",
            flops_line,
            "",
            "| objective | terms | ms/step | images/s | step vs cross-entropy | "
            "terms alone (fwd+bwd, us) | terms' extra cost / CE step | "
            "model TFLOP/s |" + (" MFU |" if peak else ""),
            "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if peak else ""),
            *rows,
            "",
            "`terms alone`: the loss terms' forward+backward on the step's "
            "[batch, 10] logits, jitted on their own (median of 7 samples); the "
            "`terms' extra cost` column is its excess over cross-entropy's, as a fraction of "
            "the cross-entropy step: what adding the terms can cost, measured "
            "without the run-to-run noise of whole steps on a shared machine.",
            "",
            "Target (each calibration loss adds at most 5%): "
            + (
                "met for every objective (`terms' extra cost` column)."
                if not over
                else f"over for {', '.join(over)} (`terms' extra cost` column)."
            ),
        ]
    )
    print(body)
    title = (
        "Train step"
        if on_cpu and args.dtype == "float32"
        else (
            f"Train step: {args.model}, {args.dtype}, batch {args.batch}"
            f" on {device.device_kind if not on_cpu else 'CPU'}"
        )
    )
    if args.out:
        Path(args.out).write_text(f"## {title}\n{body}\n")
    if not args.no_write:
        write_section(title, body)


if __name__ == "__main__":
    main()
