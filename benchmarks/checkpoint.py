"""What the per-array checksums cost a checkpoint save and restore (ResNet-20 state).

Run: ``.venv/bin/python benchmarks/checkpoint.py [--model resnet20]`` (about a
minute). Writes the ``## Checkpoint checksums`` section of benchmarks/RESULTS.md:
the size of the TrainState (parameters, BatchNorm statistics, SGD momentum),
the median time of :func:`calib_jax.train.checksums.digest` on it (what a save
adds before Orbax takes over) and of the check after a restore, next to the
time of a whole save (``save`` + ``wait``, to local disk) with and without the
checksum item, in one run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from _timing import machine_line, write_section  # noqa: E402
from calib_jax import models  # noqa: E402
from calib_jax.train import checksums  # noqa: E402
from calib_jax.train.checkpoint import Checkpointer  # noqa: E402
from calib_jax.train.state import create  # noqa: E402


def _median(fn, repeats: int = 15) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _saves(state, with_checksums: bool, repeats: int = 9) -> float:
    """Median seconds of one save + wait (a new step each time)."""
    directory = Path(tempfile.mkdtemp())
    try:
        ckpt = Checkpointer(directory, max_to_keep=2)
        samples = []
        for i in range(1, repeats + 2):
            s = state.replace(step=jnp.asarray(i, jnp.int32))
            jax.block_until_ready(s)
            start = time.perf_counter()
            if with_checksums:
                ckpt.save(s)
            else:
                ckpt.manager.save(
                    i, args=ocp.args.Composite(state=ocp.args.StandardSave(s))
                )
            ckpt.wait()
            if i > 1:  # the first one creates the directories
                samples.append(time.perf_counter() - start)
        ckpt.close()
        return statistics.median(samples)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet20")
    args = parser.parse_args()
    model = models.get_model(args.model, num_classes=10)
    tx = optax.sgd(0.1, momentum=0.9)
    sample = jnp.zeros((1, 32, 32, 3), jnp.float32)
    state = jax.jit(lambda r: create(model, tx, r, sample))(jax.random.key(0))
    jax.block_until_ready(state)
    leaves = jax.tree.leaves(state)
    nbytes = sum(x.size * x.dtype.itemsize for x in leaves)
    record = checksums.digest(state)
    t_digest = _median(lambda: checksums.digest(state))
    t_verify = _median(lambda: checksums.mismatch(state, record))
    t_plain = _saves(state, with_checksums=False)
    t_summed = _saves(state, with_checksums=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    body = f"""Machine: {machine_line()}; 1-minute load average {load} at the end \
(2 cores; above 2 means other processes shared the CPU).

Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/checkpoint.py --model \
{args.model}`

{args.model} TrainState (parameters, BatchNorm statistics, SGD momentum, step, \
key): {len(leaves)} arrays, {nbytes / 2**20:.2f} MiB. Median seconds.

| digest at save | check after restore | save + wait, no checksums | \
save + wait, with checksums | digest / save |
|---|---|---|---|---|
| {t_digest:.4f} | {t_verify:.4f} | {t_plain:.4f} | {t_summed:.4f} | \
{100 * t_digest / t_plain:.1f}% |

The two save columns differ by less than their noise on a shared machine; the \
digest's share of a save is the figure to read.

The digest is SHA-256 over each array's bytes on the host (one device-to-host \
copy of the state); it is the only part of a save that the training thread \
waits for beyond Orbax's own copy; the checksum item is written with the \
arrays, in Orbax's background commit.
"""
    print(body)
    write_section("Checkpoint checksums", body)


if __name__ == "__main__":
    main()
