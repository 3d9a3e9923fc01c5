r"""Large label spaces: metrics over bf16 logits too large for memory.

Run from the repository root (issue 23's figure: 100,000 x 50,257, about
10 GB of shards)::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/scale.py            # writes RESULTS.md
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/scale.py --rows 2000 --no-write
    # on an accelerator: 100 GB of logits in device memory (H200: 141 GB)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 .venv/bin/python benchmarks/scale.py \
        --device --rows 1000000

Shards (``--dir``, reused when a run with the same sizes left them there):
``logits-00000.npy`` (bf16 ``[n, K]``, C order) and
``logits-00000.labels.npy`` (int32 ``[n]``), the ``.npy`` layout of
:mod:`calib_jax.chunks`, ``--shard_rows`` rows each. They are written one
block of rows at a time with NumPy, so writing stays within a block's memory.
The logits imitate a language model's: a Zipf background (class of rank
:math:`r` at :math:`-\log r`, plus Gaussian noise of standard deviation 1.5)
and one boosted class per row, its log-odds against the rest drawn from a
mixture :math:`u` (half the rows :math:`\mathcal N(12, 4^2)`, confidences
piled at and just below 1.0; half :math:`\mathcal N(1, 2^2)`); the label is the boosted
class with probability :math:`\sigma(u - 0.5)` (slightly overconfident),
else a class drawn from the Zipf prior.

Measured on the CPU, each in a subprocess of its own (peak resident memory:
``VmHWM`` of the child, the whole process with the JAX runtime; and the
child's ``ru_maxrss`` as its parent sees it):

- **one sequential read** of every shard and labels file (64 MB ``readinto``
  of every byte), with the page cache of the files dropped first
  (``posix_fadvise(DONTNEED)``: "cold") and again right after ("warm");
- **streamed metrics**: ``calib_jax.metrics.summary_of_chunks(glob,
  from_logits=True)`` of accuracy, top-label ECE, adaptive ECE, NLL and
  Brier, ``--chunk_rows`` rows a chunk, after the files' page cache is
  dropped (``--cache warm`` keeps it). The chunk step is compiled first on a
  chunk of zeros (its time reported apart), the timed call is the whole
  pass, its final top-label metrics over the ``N`` collected rows included.
  Throughput is reported as the ratio of the read's time to the pass's
  (issue 23's target: at least 0.5; peak target: at most 2 GB);
- **temperature scaling** over the same shards,
  ``calib_jax.posthoc.fit_of_chunks('ts:nll', glob)``, when this checkout
  has it (``--ts_rows`` limits it to the first shards);
- **the in-memory peer**: plain NumPy (torchmetrics needs torch, which the
  environment does not have) on the first ``--peer_rows`` rows read into
  memory: the float32 softmax of the whole ``[N, K]`` array, then ECE,
  adaptive ECE, NLL and Brier as users write them; its peak memory per row
  gives the largest ``N`` that fits 2 GB and the machine's memory. The same
  child then runs ``calib_jax.metrics.summary(x, labels, from_logits=True)``
  on those rows and reports the largest difference from NumPy's values.

``--device``: on an accelerator (``--rows 1000000``, 100 GB of bf16 on the
device), no disk: the logits are generated on the device (the same model,
in JAX) as chunks of ``--chunk_rows`` rows kept in device memory; timed are
one read of all of it (a jitted row sum of each chunk) and the per-chunk
metrics of the public API (``metrics.top_label_rows``, ``nll`` and
``brier`` with ``from_logits=True`` under ``jax.jit``, the rows kept on the
device) followed by ``ece`` and ``adaptive_ece`` of the collected rows.
Writes its own section of RESULTS.md, named after the device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

BF16 = np.dtype(ml_dtypes.bfloat16)
NAMES = ("accuracy", "ece", "adaptive_ece", "nll", "brier")
NUM_BINS = 15
SIGMA = 1.5  # background noise
BLOCK_ROWS = 512  # rows generated at a time
READ_BLOCK = 64 << 20
PEAK_TARGET = 2e9
RATIO_TARGET = 0.5
MANIFEST = "scale.json"
VERSION = 2  # of the generative model; a change rewrites the shards


# ------------------------------------------------------------------ the data


def class_prior(num_classes: int, seed: int):
    """``(base [K] float32, cdf [K] float64, log_s0)``: the Zipf background.

    Class ``k`` has rank ``r_k`` (a seeded permutation of ``1..K``), base
    logit ``-log r_k`` and prior probability ``proportional to 1 / r_k``;
    ``log_s0`` is the log of the expected background sum
    ``E sum_k exp(base_k + SIGMA * eps) = exp(SIGMA**2 / 2) sum_k 1 / r_k``.
    """
    rank = np.random.default_rng(seed).permutation(num_classes) + 1.0
    base = (-np.log(rank)).astype(np.float32)
    weight = 1.0 / rank
    cdf = np.cumsum(weight) / weight.sum()
    log_s0 = float(np.log(weight.sum()) + SIGMA**2 / 2)
    return base, cdf, log_s0


def block_logits(seed: int, start: int, rows: int, prior):
    """bf16 logits ``[rows, K]`` and int32 labels of rows ``start..``, seeded
    by ``(seed, start)``: the same block whatever else is generated."""
    base, cdf, log_s0 = prior
    rng = np.random.default_rng([seed, start])
    z = rng.standard_normal((rows, base.size), dtype=np.float32)
    z *= SIGMA
    z += base
    top = np.minimum(np.searchsorted(cdf, rng.random(rows)), base.size - 1)
    confident = rng.random(rows) < 0.5
    u = np.where(confident, rng.normal(12.0, 4.0, rows), rng.normal(1.0, 2.0, rows))
    z[np.arange(rows), top] = log_s0 + u
    p_top = 1.0 / (1.0 + np.exp(-(u - 0.5)))
    other = np.minimum(np.searchsorted(cdf, rng.random(rows)), base.size - 1)
    labels = np.where(rng.random(rows) < p_top, top, other).astype(np.int32)
    return z.astype(BF16), labels


def shard_layout(rows: int, shard_rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of every shard."""
    return [(a, min(a + shard_rows, rows)) for a in range(0, rows, shard_rows)]


def shard_files(directory: Path, index: int) -> tuple[Path, Path]:
    stem = f"logits-{index:05d}"
    return directory / f"{stem}.npy", directory / f"{stem}.labels.npy"


def _write_npy(path: Path, shape, dtype, blocks) -> None:
    """An ``.npy`` file of ``shape`` written block by block (C order)."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": tuple(shape),
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype).view(np.uint8).data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_shards(
    directory: Path,
    *,
    rows: int,
    num_classes: int,
    shard_rows: int,
    seed: int = 0,
    block_rows: int = BLOCK_ROWS,
) -> tuple[list[Path], bool]:
    """Writes (or finds) the shards; ``(score paths, written)``.

    A manifest records the sizes; shards of the same sizes and generative
    model are reused. Each shard is written from blocks of ``block_rows``
    rows, a block's logits and labels generated together.
    """
    directory.mkdir(parents=True, exist_ok=True)
    spec = dict(
        version=VERSION,
        rows=rows,
        num_classes=num_classes,
        shard_rows=shard_rows,
        seed=seed,
        block_rows=block_rows,
    )
    layout = shard_layout(rows, shard_rows)
    paths = [shard_files(directory, i) for i in range(len(layout))]
    manifest = directory / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()) == spec:
        if all(x.exists() and y.exists() for x, y in paths):
            return [x for x, _ in paths], False
    manifest.unlink(missing_ok=True)
    for old in directory.glob("logits-*"):  # with unfinished .tmp files
        old.unlink()
    prior = class_prior(num_classes, seed)
    for (start, stop), (x_path, y_path) in zip(layout, paths):
        labels = []

        def blocks(start=start, stop=stop, labels=labels):
            for a in range(start, stop, block_rows):
                x, y = block_logits(seed, a, min(block_rows, stop - a), prior)
                labels.append(y)
                yield x

        _write_npy(x_path, (stop - start, num_classes), BF16, blocks())
        _write_npy(y_path, (stop - start,), np.int32, labels)
    manifest.write_text(json.dumps(spec))
    return [x for x, _ in paths], True


def all_files(paths: list[Path]) -> list[Path]:
    """The score shards and their labels files."""
    out = []
    for p in paths:
        out += [p, p.with_name(p.name[: -len(".npy")] + ".labels.npy")]
    return out


# --------------------------------------------------------------- reading


def drop_cache(paths: list[Path]) -> None:
    """Asks the kernel to drop the files' pages from its page cache
    (``POSIX_FADV_DONTNEED``; clean pages only, no privilege needed)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes() -> int:
    """The kernel's page cache (``Cached`` of /proc/meminfo), in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) * 1024
    return -1


def read_all(paths: list[Path], block: int = READ_BLOCK) -> int:
    """Reads every byte of the files in order; the number of bytes."""
    buf = memoryview(bytearray(block))
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


# ------------------------------------------------------------- NumPy peer


def numpy_metrics(x: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The in-memory path in plain NumPy: float32 softmax of all of ``x``,
    then accuracy, ECE (15 equal-width bins ``[k/M, (k+1)/M)``, 1.0 in the
    last), adaptive ECE (15 equal-mass groups of the sorted confidences,
    the ``'rank'`` rule of ``calib_jax.metrics``), NLL and Brier."""
    n = x.shape[0]
    p = x.astype(np.float32)
    p -= p.max(axis=1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=1, keepdims=True)
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) == labels
    p_label = p[np.arange(n), labels]
    brier = np.einsum("ij,ij->i", p, p) - 2.0 * p_label + 1.0
    del p
    m = NUM_BINS
    b = np.minimum((conf * m).astype(np.intp), m - 1)  # bins [k/M, (k+1)/M)
    ece = np.abs(np.bincount(b, conf, m) - np.bincount(b, correct, m)).sum() / n
    # Equal-mass groups of the sorted confidences, sized as np.array_split,
    # tied confidences kept in the group of their first occurrence.
    order = np.argsort(conf, kind="stable")
    s = conf[order]
    starts = np.cumsum([0] + [len(g) for g in np.array_split(np.arange(n), m)][:-1])
    b = np.searchsorted(starts, np.searchsorted(s, s, side="left"), side="right") - 1
    gap = np.bincount(b, s, m) - np.bincount(b, correct[order], m)
    return {
        "accuracy": float(correct.mean()),
        "ece": float(ece),
        "adaptive_ece": float(np.abs(gap).sum() / n),
        "nll": float(-np.mean(np.log(np.maximum(p_label, np.finfo(np.float32).tiny)))),
        "brier": float(brier.mean()),
    }


def read_rows(paths: list[Path], rows: int):
    """The first ``rows`` rows of the shards, in memory."""
    xs, ys, left = [], [], rows
    for path in paths:
        if left <= 0:
            break
        x = np.load(path, mmap_mode="r")
        y = np.load(all_files([path])[1])
        take = min(left, x.shape[0])
        xs.append(np.array(x[:take]).view(BF16))
        ys.append(np.asarray(y[:take]))
        left -= take
    return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------ subprocesses


def _vmhwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def child_read(args) -> dict:
    paths = [Path(p) for p in args["files"]]
    start, cpu = time.perf_counter(), time.process_time()
    total = read_all(paths)
    return {
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "bytes": total,
    }


def child_metrics(args) -> dict:
    from calib_jax.metrics import summary_of_chunks

    k, rows = args["num_classes"], args["chunk_rows"]
    run = lambda source: summary_of_chunks(  # noqa: E731
        source,
        from_logits=True,
        names=NAMES,
        chunk_rows=rows,
        progress_bar=False,
    )
    start = time.perf_counter()
    zeros = np.zeros((rows, k), BF16)
    run([(zeros, np.zeros(rows, np.int32))])
    del zeros
    compile_s = time.perf_counter() - start
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    out = run(args["glob"])
    values = {key: float(v) for key, v in out.items()}
    return {
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "compile_seconds": compile_s,
        "values": values,
        "vmhwm": _vmhwm(),
        "load": [load, os.getloadavg()[0]],
    }


def child_ts(args) -> dict:
    from calib_jax import chunks, posthoc

    fit_of_chunks = getattr(posthoc, "fit_of_chunks", None)
    if fit_of_chunks is None:
        return {"missing": "calib_jax.posthoc.fit_of_chunks is not in this checkout"}

    class Counted(chunks.ChunkSource):
        """The shards, counting the passes over them."""

        passes = 0

        def __iter__(self):
            Counted.passes += 1
            return super().__iter__()

    source = Counted(args["shards"], chunk_rows=args["chunk_rows"], progress_bar=False)
    start, cpu = time.perf_counter(), time.process_time()
    calibrator = fit_of_chunks("ts:nll", source, progress_bar=False)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "cpu": time.process_time() - cpu,
        "passes": Counted.passes,
        "temperature": float(calibrator.params["temperature"]),
        "vmhwm": _vmhwm(),
    }


def child_peer(args) -> dict:
    paths = [Path(p) for p in args["shards"]]
    x, labels = read_rows(paths, args["rows"])
    _reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    values = numpy_metrics(x, labels)
    seconds = time.perf_counter() - start
    out = {
        "rows": int(x.shape[0]),
        "seconds": seconds,
        "cpu": time.process_time() - cpu,
        "values": values,
        "vmhwm": _vmhwm(),
    }
    out["data_bytes"] = int(x.nbytes + labels.nbytes)
    from calib_jax import metrics

    ours = metrics.summary(x, labels, from_logits=True, names=NAMES)
    out["calib_jax_values"] = {k: float(v) for k, v in ours.items()}
    return out


def child_parts(args) -> dict:
    """CPU seconds per entry of the row reductions of one chunk, each under
    ``jax.jit`` on a device-resident chunk: a float32 row sum (reads the
    chunk once), the public from-logits functions (top-label rows, NLL,
    Brier: each its own row maximum and exponentials), and the one fused
    pass of the streamed chunk step (``_logit_rows.fused_rows``) that
    computes all of them; the best of 3 calls each."""
    import jax
    import jax.numpy as jnp

    from calib_jax import metrics
    from calib_jax.metrics import _logit_rows

    rows, k = args["chunk_rows"], args["num_classes"]
    x, y = block_logits(0, 0, rows, class_prior(k, 0))
    x, y = jax.device_put(x), jax.device_put(y)
    parts = {
        "row sum": lambda x, y: jnp.sum(x, axis=1, dtype=jnp.float32),
        "top_label_rows": lambda x, y: metrics.top_label_rows(x, y, from_logits=True),
        "nll": lambda x, y: metrics.nll(x, y, from_logits=True),
        "brier": lambda x, y: metrics.brier(x, y, from_logits=True),
        "fused": _logit_rows.fused_rows,
    }
    out = {}
    for name, fn in parts.items():
        fn = jax.jit(fn)
        jax.block_until_ready(fn(x, y))
        best = math.inf
        for _ in range(3):
            cpu = time.process_time()
            jax.block_until_ready(fn(x, y))
            best = min(best, time.process_time() - cpu)
        out[name] = best / x.size
    return out


CHILDREN = {
    "read": child_read,
    "metrics": child_metrics,
    "ts": child_ts,
    "peer": child_peer,
    "parts": child_parts,
}


def run_child(kind: str, args: dict, timeout: float | None = None) -> dict:
    """Runs ``CHILDREN[kind](args)`` in a fresh Python process; its result,
    with ``ru_maxrss`` (bytes) and CPU seconds of the child as the parent's
    ``wait4`` sees them. A child still running after ``timeout`` seconds is
    killed: ``{"timeout": timeout}``."""
    env = dict(os.environ, CALIB_JAX_PROGRESS="0")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", kind, json.dumps(args)],
            stdout=out,
            stderr=err,
            env=env,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                return {"timeout": timeout}
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-3000:]
            raise RuntimeError(f"child {kind!r} failed ({proc.returncode}):\n{tail}")
        out.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :])
    result["ru_maxrss"] = usage.ru_maxrss * 1024
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    return result


# --------------------------------------------------------------- device


def device_prior(num_classes: int, seed: int):
    base, cdf, log_s0 = class_prior(num_classes, seed)
    return base, cdf.astype(np.float32), log_s0


def device_chunk(key, rows: int, base, cdf, log_s0):
    """bf16 logits ``[rows, K]`` and int32 labels of :func:`block_logits`'s
    model, generated on the device (jittable)."""
    import jax
    import jax.numpy as jnp

    k_noise, k_top, k_mix, k_u1, k_u2, k_other, k_pick = jax.random.split(key, 7)
    k = base.shape[0]
    z = SIGMA * jax.random.normal(k_noise, (rows, k), jnp.float32) + base[None, :]
    draw = lambda key: jnp.minimum(  # noqa: E731
        jnp.searchsorted(cdf, jax.random.uniform(key, (rows,))), k - 1
    )
    top = draw(k_top)
    u = jnp.where(
        jax.random.uniform(k_mix, (rows,)) < 0.5,
        12.0 + 4.0 * jax.random.normal(k_u1, (rows,)),
        1.0 + 2.0 * jax.random.normal(k_u2, (rows,)),
    )
    z = z.at[jnp.arange(rows), top].set(log_s0 + u)
    pick = jax.random.uniform(k_pick, (rows,)) < jax.nn.sigmoid(u - 0.5)
    labels = jnp.where(pick, top, draw(k_other)).astype(jnp.int32)
    return z.astype(jnp.bfloat16), labels


def device_functions():
    """``(read, step, final)``, jitted: one read of a chunk (row sums in
    float32); a chunk's top-label rows and NLL and Brier sums (the public
    metrics, ``from_logits=True``); ECE and adaptive ECE of the rows."""
    import jax
    import jax.numpy as jnp

    from calib_jax import metrics

    @jax.jit
    def read(x):
        return jnp.sum(x, axis=1, dtype=jnp.float32)

    @jax.jit
    def step(x, labels):
        rows = metrics.top_label_rows(x, labels, from_logits=True)
        n = x.shape[0]
        nll = metrics.nll(x, labels, from_logits=True) * n
        brier = metrics.brier(x, labels, from_logits=True) * n
        return rows.confidence, rows.correct, nll, brier

    @jax.jit
    def final(conf, correct, nll, brier):
        rows = metrics.TopLabelRows(conf, correct)
        n = conf.shape[0]
        return {
            "accuracy": jnp.mean(correct.astype(jnp.float32)),
            "ece": metrics.ece(rows, None, num_bins=NUM_BINS),
            "adaptive_ece": metrics.adaptive_ece(rows, None, num_bins=NUM_BINS),
            "nll": jnp.sum(nll) / n,
            "brier": jnp.sum(brier) / n,
        }

    return read, step, final


def device_metrics(data, functions) -> dict:
    """The metrics of ``data`` (a list of ``(x, labels)`` device chunks)."""
    import jax.numpy as jnp

    _, step, final = functions
    parts = [step(x, y) for x, y in data]
    conf, correct, nll, brier = (
        jnp.concatenate([p[i].reshape(-1) for p in parts]) for i in range(4)
    )
    return final(conf, correct, nll, brier)


def run_device(opts) -> dict:
    import jax

    functions = device_functions()
    base, cdf, log_s0 = device_prior(opts.classes, opts.seed)
    make = jax.jit(lambda key: device_chunk(key, opts.chunk_rows, base, cdf, log_s0))
    chunks = math.ceil(opts.rows / opts.chunk_rows)
    keys = jax.random.split(jax.random.key(opts.seed), chunks)
    start = time.perf_counter()
    data = [make(keys[i]) for i in range(chunks)]
    jax.block_until_ready(data)
    generate_s = time.perf_counter() - start
    read = functions[0]

    def read_once():
        return jax.block_until_ready([read(x) for x, _ in data])

    def metrics_once():
        return jax.block_until_ready(device_metrics(data, functions))

    timings = {}
    for name, fn in (("read", read_once), ("metrics", metrics_once)):
        fn()  # compile
        samples = []
        for _ in range(opts.repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        timings[name] = statistics.median(samples)
    values = {k: float(v) for k, v in metrics_once().items()}
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {
        "mode": "device",
        "device": device.device_kind,
        "rows": chunks * opts.chunk_rows,
        "num_classes": opts.classes,
        "chunk_rows": opts.chunk_rows,
        "data_bytes": chunks * opts.chunk_rows * (opts.classes * 2 + 4),
        "generate_seconds": generate_s,
        "read_seconds": timings["read"],
        "metrics_seconds": timings["metrics"],
        "ratio": timings["read"] / timings["metrics"],
        "peak_device_bytes": stats.get("peak_bytes_in_use"),
        "values": values,
    }


# --------------------------------------------------------------- reporting


def _gb(b) -> str:
    return "-" if b is None else f"{b / 1e9:.2f} GB"


def cpu_table(r: dict) -> str:
    read, read_warm = r["read_cold"], r["read_warm"]
    streamed, ts, peer = r["metrics"], r.get("ts", {}), r["peer"]
    n, k = r["rows"], r["num_classes"]
    data = r["data_bytes"]
    lines = [
        "| step | rows | wall s | CPU s | GB/s of shards | ratio to one cold read "
        "| peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name, rows, part, nbytes, peak, passes=1):
        seconds, cpu = part["seconds"] / passes, part["cpu"] / passes
        ratio = read["seconds"] / seconds * nbytes / data
        lines.append(
            f"| {name} | {rows:,} | {seconds:.1f} | {cpu:.1f} "
            f"| {nbytes / seconds / 1e9:.2f} | {ratio:.2f} | {_gb(peak)} |"
        )

    row("one sequential read, cold", n, read, data, read["ru_maxrss"])
    row("one sequential read, warm", n, read_warm, data, read_warm["ru_maxrss"])
    row("streamed metrics (`summary_of_chunks`)", n, streamed, data, streamed["vmhwm"])
    if "seconds" in ts:
        row(
            f"TS fit (`fit_of_chunks('ts:nll')`), one pass of {ts['passes']}",
            ts["rows"],
            ts,
            ts["rows"] * (k * 2 + 4),
            ts["vmhwm"],
            passes=ts["passes"],
        )
    row(
        "NumPy in memory (float32 softmax)",
        peer["rows"],
        peer,
        peer["rows"] * (k * 2 + 4),
        peer["vmhwm"],
    )
    return "\n".join(lines)


def cpu_section(r: dict) -> str:
    from _timing import machine_line

    n, k = r["rows"], r["num_classes"]
    read, streamed, peer = r["read_cold"], r["metrics"], r["peer"]
    ratio = read["seconds"] / streamed["seconds"]
    ratio_warm = r["read_warm"]["seconds"] / streamed["seconds"]
    peak = streamed["vmhwm"]
    per_row = (peer["vmhwm"] - peer["base_vmhwm"]) / peer["rows"]
    fits_2gb = int((PEAK_TARGET - peer["base_vmhwm"]) / per_row)
    fits_ram = int((r["mem_total"] - peer["base_vmhwm"]) / per_row)
    diffs = max(
        abs(peer["values"][key] - peer["calib_jax_values"][key])
        / max(abs(peer["values"][key]), 1e-12)
        for key in NAMES
    )
    values = ", ".join(f"{key} {streamed['values'][key]:.5f}" for key in NAMES)
    ts = r.get("ts", {})
    if "missing" in ts:
        ts_line = f"- TS fit: {ts['missing']}; not measured."
    elif "timeout" in ts:
        ts_line = (
            f"- TS fit (`fit_of_chunks('ts:nll')`) over {ts['rows']:,} rows: "
            f"stopped unfinished after {ts['timeout']:.0f} s; not measured."
        )
    else:
        ts_line = (
            f"- TS fit (`fit_of_chunks('ts:nll')`, L-BFGS on log T, one pass over "
            f"the chunks per evaluation) over {'all' if ts['rows'] == n else 'the first'} "
            f"{ts['rows']:,} rows: "
            f"T = {ts['temperature']:.4f} after {ts['passes']} passes, "
            f"{ts['seconds']:.1f} s ({ts['seconds'] / ts['passes']:.1f} s a pass, "
            f"compile included), peak {_gb(ts['vmhwm'])}."
        )
    verdict_ratio = "meets" if ratio >= RATIO_TARGET else "misses"
    verdict_peak = "meets" if peak <= PEAK_TARGET else "misses"
    parts = r["parts"]
    parts_line = ", ".join(
        f"{name} {parts[name] * 1e9:.2f}" for name in ("top_label_rows", "nll", "brier")
    )
    streamed_ns = streamed["cpu"] / (n * k) * 1e9
    read_ns = read["cpu"] / (n * k) * 1e9
    parts_sum = sum(parts[name] for name in ("top_label_rows", "nll", "brier")) * 1e9
    fused_ns = parts["fused"] * 1e9
    cores = streamed["cpu"] / streamed["seconds"]
    load_start, load_end = streamed.get("load", [r["load"], r["load"]])
    need = streamed["cpu"] / (2 * read["seconds"])  # cores for the 0.5 target
    if ratio >= RATIO_TARGET:
        bound_line = ""
    elif need <= min(r["cpu_count"], 2):
        bound_line = (
            f"The 0.5 target needs the pass's {streamed['cpu']:.1f} CPU s within "
            f"{2 * read['seconds']:.1f} s, {need:.2f} cores on average (the "
            "reading thread and two steps in flight let it use up to two); it got "
            f"{cores:.2f} at a load average of {load_start:.1f} to {load_end:.1f} "
            f"on the {r['cpu_count']} cores: the other jobs' share of the cores."
        )
    else:
        bound_line = (
            f"The pass is bound by its arithmetic: {streamed['cpu']:.1f} CPU s "
            f"within {2 * read['seconds']:.1f} s (the 0.5 target) would need "
            f"{need:.2f} cores."
        )
    sv = streamed["values"]
    ece_line = (
        "- ECE and adaptive ECE agree to the digits shown: when every bin of both "
        "binnings\n  is overconfident (the generated model's label is the boosted "
        "class with\n  probability sigma(u - 0.5), below its confidence), both equal "
        "the mean\n  confidence minus the accuracy.\n"
        if abs(sv["ece"] - sv["adaptive_ece"]) <= 1e-4 * abs(sv["ece"])
        else ""
    )
    worst = max(
        NAMES,
        key=lambda key: (
            abs(peer["values"][key] - peer["calib_jax_values"][key])
            / max(abs(peer["values"][key]), 1e-12)
        ),
    )
    return f"""\
Machine: {r.get("machine") or machine_line()}; load average at start {r["load"]:.1f} (the cores
are shared with other jobs: wall times are noisy, CPU seconds less so).
Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/scale.py {r["argv"]}`
({n:,} rows x {k:,} classes of bf16 logits, {_gb(r["data_bytes"])} in
{r["num_shards"]} `.npy` shards of {r["shard_rows"]:,} rows plus labels;
chunks of {r["chunk_rows"]:,} rows).
Every step in a subprocess of its own; peak RSS is the child's `VmHWM` (the
whole process, JAX runtime included). "Cold": the shards' page cache dropped
with `posix_fadvise(DONTNEED)` just before (the page cache fell by
{_gb(r["evicted_bytes"])} on the first drop); "warm": read again at once.

{cpu_table(r)}

- Streamed metrics ({", ".join(NAMES)}; `from_logits=True`, no class-wise
  ECE): {streamed["seconds"]:.1f} s after {streamed["compile_seconds"]:.1f} s of
  compiling the chunk step on a chunk of zeros; ratio to one cold read
  {ratio:.2f} ({verdict_ratio} the 0.5 target), to one warm read
  {ratio_warm:.2f}; peak RSS {_gb(peak)} ({verdict_peak} the 2 GB target;
  `ru_maxrss` {_gb(streamed["ru_maxrss"])}). Values: {values}.
- Where the time goes (CPU seconds, so less sensitive to the other load):
  the pass used {streamed_ns:.2f} CPU ns per logit, one cold read
  {read_ns:.2f} and a float32 row sum of a chunk in device memory
  {parts["row sum"] * 1e9:.2f}. The chunk step's one fused row pass
  (`_logit_rows.fused_rows`: one row maximum and one exponential per logit
  for the confidence, correctness, label log-probability, Brier row and
  finiteness) {fused_ns:.2f} ns, against the public from-logits functions,
  each under `jax.jit` alone on one chunk and each its own row maximum and
  exponentials: {parts_line} ns, together {parts_sum:.1f} ns. The shards'
  chunks are read into memory by a background thread two chunks ahead, and
  two chunk steps are in flight: the pass used {cores:.2f} cores on average
  (CPU s / wall s; load average {load_start:.1f} at its start, {load_end:.1f}
  at its end). {bound_line}
{ece_line}{ts_line}
- Peer: plain NumPy (torchmetrics needs torch, not installed here) on the
  first {peer["rows"]:,} rows held in memory: float32 softmax of the whole
  array, then the same five metrics, {peer["seconds"]:.1f} s
  ({peer["rows"] / peer["seconds"]:,.0f} rows/s against the streamed
  {n / streamed["seconds"]:,.0f} rows/s), peak {_gb(peer["vmhwm"])} with the
  bf16 rows loaded ({per_row / 1e3:,.0f} KB per row above the
  {_gb(peer["base_vmhwm"])} of the loaded process before its first row), so at
  most about {max(fits_2gb, 0):,} rows fit 2 GB and {fits_ram:,} rows the
  machine's {_gb(r["mem_total"])} (extrapolated, not run). calib_jax's in-memory
  `summary(x, labels, from_logits=True)` of the same rows differs from NumPy's
  values by at most {diffs:.1e} relative ({worst}).
"""


def device_section(r: dict) -> str:
    from _timing import machine_line

    values = ", ".join(f"{key} {r['values'][key]:.5f}" for key in NAMES)
    return f"""\
{machine_line()}. `benchmarks/scale.py --device --rows {r["rows"]}`:
{r["rows"]:,} rows x {r["num_classes"]:,} classes of bf16 logits generated on
the device ({_gb(r["data_bytes"])} with labels), chunks of {r["chunk_rows"]:,} rows,
medians of several passes after a compile pass.

| step | seconds | ratio to one read |
|---|---|---|
| one read (row sums of every chunk) | {r["read_seconds"]:.3f} | 1.00 |
| per-chunk metrics + ECE, adaptive ECE of the rows | {r["metrics_seconds"]:.3f} | {r["ratio"]:.2f} |

Peak device memory {_gb(r["peak_device_bytes"])}; values: {values}.
"""


# --------------------------------------------------------------- main


def run_cpu(opts) -> dict:
    from _timing import machine_line

    directory = Path(opts.dir)
    start = time.perf_counter()
    paths, written = write_shards(
        directory,
        rows=opts.rows,
        num_classes=opts.classes,
        shard_rows=opts.shard_rows,
        seed=opts.seed,
    )
    print(
        f"shards: {len(paths)} in {directory} "
        f"({'written' if written else 'reused'}, {time.perf_counter() - start:.1f} s)",
        flush=True,
    )
    files = all_files(paths)
    data = sum(p.stat().st_size for p in files)
    r = {
        "mode": "cpu",
        "rows": opts.rows,
        "num_classes": opts.classes,
        "shard_rows": opts.shard_rows,
        "num_shards": len(paths),
        "chunk_rows": opts.chunk_rows,
        "data_bytes": data,
        "cpu_count": os.cpu_count(),
        "load": os.getloadavg()[0],
        "machine": machine_line(),
        "argv": " ".join(sys.argv[1:]),
        "mem_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }
    before = cached_bytes()
    drop_cache(files)
    r["evicted_bytes"] = before - cached_bytes()
    r["read_cold"] = run_child("read", {"files": [str(p) for p in files]})
    r["read_warm"] = run_child("read", {"files": [str(p) for p in files]})
    print(
        f"read: cold {r['read_cold']['seconds']:.1f} s, warm "
        f"{r['read_warm']['seconds']:.1f} s",
        flush=True,
    )
    glob = str(directory / "logits-*.npy")
    if opts.cache == "cold":
        drop_cache(files)
    r["metrics"] = run_child(
        "metrics",
        {"glob": glob, "num_classes": opts.classes, "chunk_rows": opts.chunk_rows},
    )
    print(f"streamed metrics: {r['metrics']['seconds']:.1f} s", flush=True)
    r["parts"] = run_child(
        "parts", {"num_classes": opts.classes, "chunk_rows": opts.chunk_rows}
    )
    peer_rows = min(opts.peer_rows, opts.rows)
    # The loaded process's peak before any row is read: a peer child of 1 row.
    r["peer"] = run_child(
        "peer", {"shards": [str(p) for p in paths], "rows": peer_rows}
    )
    r["peer"]["base_vmhwm"] = run_child(
        "peer", {"shards": [str(p) for p in paths], "rows": 1}
    )["vmhwm"]
    print(f"peer: {r['peer']['seconds']:.1f} s", flush=True)
    ts_paths = paths
    if opts.ts_rows:
        ts_paths = paths[: math.ceil(opts.ts_rows / opts.shard_rows)]
    if opts.cache == "cold":
        drop_cache(files)
    r["ts"] = run_child(
        "ts",
        {"shards": [str(p) for p in ts_paths], "chunk_rows": opts.chunk_rows},
        timeout=opts.ts_timeout or None,
    )
    r["ts"]["rows"] = min(len(ts_paths) * opts.shard_rows, opts.rows)
    print(f"ts: {r['ts']}", flush=True)
    return r


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=50_257)
    parser.add_argument("--shard_rows", type=int, default=8192)
    parser.add_argument("--chunk_rows", type=int, default=1024)
    parser.add_argument("--peer_rows", type=int, default=16384)
    parser.add_argument(
        "--ts_rows", type=int, default=0, help="rows of the TS fit (0: all)"
    )
    parser.add_argument(
        "--ts_timeout", type=float, default=0, help="seconds; stop the TS fit after"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dir", default=os.path.join(tempfile.gettempdir(), "calib_jax_scale")
    )
    parser.add_argument("--cache", choices=("cold", "warm"), default="cold")
    parser.add_argument("--delete", action="store_true", help="remove the shards after")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--from_json", default=None, help="render a saved --json run instead"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--device", action="store_true", help="on the accelerator")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        kind, args = opts.child
        print("RESULT " + json.dumps(CHILDREN[kind](json.loads(args))), flush=True)
        return
    if opts.from_json:
        r = json.loads(Path(opts.from_json).read_text())
    elif opts.device:
        r = run_device(opts)
    else:
        r = run_cpu(opts)
        if opts.delete:
            shutil.rmtree(opts.dir)
    if r["mode"] == "device":
        title = f"Large label spaces on {r['device']}"
        body = device_section(r)
    else:
        title = "Large label spaces: streamed metrics over bf16 shards (cpu)"
        body = cpu_section(r)
    print(body)
    if opts.json and not opts.from_json:
        Path(opts.json).write_text(json.dumps(r, indent=1))
    if not opts.no_write:
        from _timing import write_section

        write_section(title, body)


if __name__ == "__main__":
    main()
