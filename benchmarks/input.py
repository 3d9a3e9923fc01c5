"""Host images/s of the CIFAR training path into device buffers: per-record vs decoded.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python benchmarks/input.py`` (about 2 minutes
on 2 CPU cores, most of it writing the data once). Writes the ``## Input
pipeline`` section of benchmarks/RESULTS.md.

The source is a real TFDS array_record build of ``cifar10`` (read through
``tfds.data_source``, as the trainer reads it), written here without
TensorFlow: 50,000 training records of random 32x32x3 uint8 images, each
PNG-encoded in a ``tf.train.Example`` like ``tfds build`` writes them (random
pixels compress worse than photographs: about 3.2 KB per PNG instead of about
2.3 KB). It is kept under ``--data_dir`` and reused by later runs.

Measured in one run, for 1 and for 8 CPU devices (a subprocess each):

- ``per-record``: the path before the change, ``pipeline.train_batch`` on
  the ``TfdsSource`` (one PNG decode per image, float32 on the host).
- ``decoded``: the trainer's path now, the ``batch(step)`` of
  ``calib_jax.train.setup.build``: the split decoded once
  (``cache.SplitCache``), ``pipeline.train_batch(..., to_float=False)`` (one
  uint8 gather), a ``mask`` and ``mesh.put_batch`` with the batch sharding;
  from host memory, from the memory-mapped ``.npy`` cache, and through
  ``prefetch.Prefetcher(depth=2)`` as the training loop consumes it.

Each rate counts images until ``jax.block_until_ready`` of the placed global
batch. Also the one-time cost of decoding the split: with one thread, with the
default thread pool, and with grain's threaded and multi-process readers when
grain is installed (the measurement behind grain leaving the requirements).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import numpy as np

TARGET = 50_000  # images/s into device buffers at batch 128
DECODE_PREFIX = 4000  # records decoded by each way in each round
N_TRAIN, N_TEST = 50_000, 1000


def write_tfds_cifar10(data_dir: Path, n_train: int, n_test: int) -> None:
    """Writes an array_record ``cifar10`` build of random PNG images (no TensorFlow)."""
    import tensorflow_datasets as tfds
    from array_record.python import array_record_module
    from PIL import Image
    from tensorflow_datasets.core import naming
    from tensorflow_datasets.core import splits as splits_lib
    from tensorflow_datasets.proto import tf_example_pb2

    builder = tfds.builder(
        "cifar10", data_dir=str(data_dir), file_format="array_record"
    )
    out = Path(builder.data_dir)
    if (out / "dataset_info.json").exists():
        source = tfds.data_source("cifar10", split="train", data_dir=str(data_dir))
        if len(source) == n_train:
            return
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    infos = []
    for split, n in (("train", n_train), ("test", n_test)):
        template = naming.ShardedFileTemplate(
            data_dir=out,
            dataset_name="cifar10",
            split=split,
            filetype_suffix="array_record",
        )
        path = template.sharded_filepath(shard_index=0, num_shards=1)
        writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
        size = 0
        for i in range(n):
            png = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), np.uint8)).save(
                png, format="PNG"
            )
            example = tf_example_pb2.Example()
            feature = example.features.feature
            feature["image"].bytes_list.value.append(png.getvalue())
            feature["label"].int64_list.value.append(int(rng.integers(10)))
            feature["id"].bytes_list.value.append(f"{split}_{i:05d}".encode())
            record = example.SerializeToString()
            size += len(record)
            writer.write(record)
        writer.close()
        infos.append(
            splits_lib.SplitInfo(
                name=split,
                shard_lengths=[n],
                num_bytes=size,
                filename_template=template,
            )
        )
    builder.info.set_splits(splits_lib.SplitDict(infos))
    builder.info.write_to_directory(out)


def _rate(fetch, steps, batch_size) -> float:
    import jax

    jax.block_until_ready(fetch(steps[0] + 10_000))  # warm-up, another step
    start = time.perf_counter()
    for step in steps:
        jax.block_until_ready(fetch(step))
    return len(steps) * batch_size / (time.perf_counter() - start)


def _grain_read(records, count: int, threads: int, processes: int) -> None:
    """Reads the first ``count`` records with grain (threads or worker processes)."""
    import grain
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # grain's workers read absl flags
    dataset = (
        grain.MapDataset.source(records.source)
        .slice(slice(0, count))
        .map(_image_of)
        .batch(256)
        .to_iter_dataset(grain.ReadOptions(num_threads=threads))
    )
    if processes:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(processes))
    assert sum(len(block) for block in dataset) == count


def _image_of(example):
    return example["image"]


def decode_rates(records, count: int = DECODE_PREFIX, rounds: int = 3) -> dict:
    """Records/s of each way to decode the first ``count`` records (median of rounds).

    The ways are timed in turn within each round, so a change of machine load
    during the run affects them alike.
    """
    from calib_jax.data import SubsetSource, cache

    prefix = SubsetSource(records, np.arange(count))
    ways = {
        "1 thread": lambda: cache.decode(prefix, workers=1),
        "thread pool, 2": lambda: cache.decode(prefix, workers=2),
        "thread pool, 8 (default)": lambda: cache.decode(prefix, workers=8),
    }
    try:
        import grain  # noqa: F401 - measured when installed
    except ImportError:
        pass
    else:
        ways["grain, 8 threads"] = lambda: _grain_read(records, count, 8, 0)
        ways["grain, 2 processes"] = lambda: _grain_read(records, count, 1, 2)
    seconds = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            seconds[name].append(time.perf_counter() - start)
    return {name: count / statistics.median(t) for name, t in seconds.items()}


def worker(data_dir: Path, devices: int, full: bool) -> dict:
    """Measures every path with ``devices`` CPU devices; returns the figures."""
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    from calib_jax import data
    from calib_jax.data import cache, pipeline, prefetch
    from calib_jax.train import mesh as mesh_lib

    assert len(jax.devices()) == devices
    rows = mesh_lib.batch_sharding(mesh_lib.data_mesh())
    records = data.get_dataset("cifar10", data_dir=str(data_dir), val_size=0).source(
        "train"
    )
    assert len(records) == N_TRAIN
    out: dict = {"devices": devices, "rates": {}, "decode": {}}

    def timed(fn):
        start = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - start

    decoded, seconds = timed(lambda: cache.SplitCache().get(records))
    out["decode"]["thread pool (default)"] = seconds
    with tempfile.TemporaryDirectory() as tmp:
        _, out["decode"]["into the .npy cache"] = timed(
            lambda: cache.SplitCache(memory_bytes=0, cache_dir=tmp).get(records)
        )
        mapped, out["decode"]["reopen the .npy cache"] = timed(
            lambda: cache.SplitCache(memory_bytes=0, cache_dir=tmp).get(records)
        )
        assert isinstance(mapped.images, np.memmap)
        if full:
            out["decode_rates"] = decode_rates(records)

        for batch_size in (128, 512):
            kw = {"batch_size": batch_size, "seed": 0}

            def old(step, kw=kw):
                batch = pipeline.train_batch(records, step=step, **kw)
                batch["mask"] = np.ones(len(batch["label"]), bool)
                return mesh_lib.put_batch(batch, rows)

            def new(step, source=decoded, kw=kw):
                batch = pipeline.train_batch(source, step=step, to_float=False, **kw)
                batch["mask"] = np.ones(len(batch["label"]), bool)
                return mesh_lib.put_batch(batch, rows)

            few = list(range(max(2, 2560 // batch_size)))
            many = list(range(max(50, 64_000 // batch_size)))
            rates = out["rates"][str(batch_size)] = {}
            rates["per-record"] = _rate(old, few, batch_size)
            rates["decoded, memory"] = _rate(new, many, batch_size)
            rates["decoded, .npy memory map"] = _rate(
                lambda s, kw=kw: new(s, mapped, kw), many, batch_size
            )
            with prefetch.Prefetcher(map(new, many), 2) as feed:
                start = time.perf_counter()
                for placed in feed:
                    jax.block_until_ready(placed)
                rates["decoded, memory, prefetch 2"] = (
                    len(many) * batch_size / (time.perf_counter() - start)
                )
    return out


def _table(results: list[dict]) -> str:
    paths = list(results[0]["rates"]["128"])
    lines = [
        "| devices | batch | " + " | ".join(paths) + " | decoded / per-record |",
        "|---" * (len(paths) + 3) + "|",
    ]
    for r in results:
        for batch, rates in r["rates"].items():
            cells = [f"{rates[p]:,.0f}" for p in paths]
            ratio = rates["decoded, memory"] / rates["per-record"]
            lines.append(
                f"| {r['devices']} | {batch} | "
                + " | ".join(cells)
                + f" | {ratio:.0f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data_dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "calib_jax_input_bench",
        help="where the TFDS cifar10 build is written once and reused",
    )
    parser.add_argument("--worker_devices", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no_write", action="store_true", help="print only")
    args = parser.parse_args()
    if args.worker_devices:
        result = worker(args.data_dir, args.worker_devices, args.worker_devices == 1)
        print("RESULT " + json.dumps(result))
        return

    import _timing

    start = time.perf_counter()
    write_tfds_cifar10(args.data_dir, N_TRAIN, N_TEST)
    print(f"data ready in {time.perf_counter() - start:.0f} s", flush=True)
    load = [os.getloadavg()[0]]
    results = []
    for devices in (1, 8):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                f"--data_dir={args.data_dir}",
                f"--worker_devices={devices}",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.exit(f"worker ({devices} devices) failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
        print(json.dumps(results[-1], indent=1), flush=True)
    load.append(os.getloadavg()[0])

    decode = results[0]["decode"]
    at_128 = min(r["rates"]["128"]["decoded, memory"] for r in results)
    body = "\n".join(
        [
            (
                f"Machine: {_timing.machine_line()}. 1-minute load average "
                f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (2 cores "
                "shared with other sessions: above 2, other processes were running and "
                "every figure is lower than on a quiet machine; ratios within a row are "
                "measured in the same process)."
            ),
            "Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/input.py`",
            "",
            (
                "Source: a TFDS array_record `cifar10` build read through "
                "`tfds.data_source` (50,000 PNG records of random 32x32x3 uint8 images, "
                "written by the script without TensorFlow). Images per second into "
                "device buffers (until `jax.block_until_ready` of the placed global "
                "batch; per-record: a few batches, decoded: 64,000 images per figure). "
                "Columns: `per-record` = `pipeline.train_batch` on the `TfdsSource` as "
                "training did before (a PNG decode per image, float32 on the host); "
                "`decoded` = the trainer's `batch(step)` now (one uint8 gather from the "
                "split decoded once, the mask, `put_batch` with the batch "
                "sharding), from memory, from the memory-mapped `.npy` cache, and "
                "through `Prefetcher(depth=2)`."
            ),
            "",
            _table(results),
            "",
            (
                f"Target: >= {TARGET:,} images/s at batch 128: {at_128:,.0f} "
                f"({'met' if at_128 >= TARGET else 'not met'})."
            ),
            "",
            "One-time cost of decoding the 50,000-record split, seconds: "
            + "; ".join(f"{k} {v:.1f}" for k, v in decode.items())
            + " (the `.npy` cache is decoded into once, then reopened by later runs "
            "after checking its metadata and two records).",
            "",
            f"Ways to decode (records/s over the first {DECODE_PREFIX:,} records, "
            "median of 3 rounds, the ways timed in turn in each round; grain's "
            "worker processes include their start-up, part of a one-time decode): "
            + "; ".join(f"{k} {v:,.0f}" for k, v in results[0]["decode_rates"].items())
            + ".",
        ]
    )
    print(body)
    if not args.no_write:
        _timing.write_section("Input pipeline", body)


if __name__ == "__main__":
    main()
