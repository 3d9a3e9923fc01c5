"""Speed and memory of ece, adaptive_ece and classwise_ece against NumPy.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python benchmarks/metrics.py`` (about 30
seconds on 2 cores). Writes the ``## Metrics`` section of
benchmarks/RESULTS.md.

For every (N, K) the same float32 softmax array is given to

- the read-once floor, ``jax.jit(lambda p: p.max(axis=1))``;
- ``jax.jit`` of each calib_jax metric (the traced call skips the host-side
  value checks, so this is the metric alone);
- a plain NumPy implementation of the same metric (argmax, bincount, sort).

Timings are medians over interleaved rounds (every function once per round,
so background load hits all of them alike), after one compile call. Memory:
for JAX the XLA temporary buffers of the compiled computation (everything
allocated beyond the inputs and the scalar output); for NumPy the
``tracemalloc`` peak of one call. A streaming check evaluates 10M samples in
100 batches of :class:`BinnedStats` against the one-shot value.

``--only eager`` writes the section "Metrics: eager calls vs jax.jit": each
metric called as users call it (eagerly; its input checks included, fused
into its compiled call) next to the same call under ``jax.jit`` (no value
checks), timed in interleaved rounds, and the first call's cost per shape in
a fresh process state (compile included): wall seconds and the process's CPU
seconds (less sensitive to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from _timing import write_section

from calib_jax import metrics

SIZES = ((10_000, 10), (1_000_000, 10), (100_000, 1000))
TARGET = 1.5
TARGET_SIZES = ((1_000_000, 10), (100_000, 1000))
M = 15


NOTES = """\
Notes:

- `ece` reads `probs` once: one max-reduction over packed uint32 keys
  (probability bits and two label flags) gives the confidence and the argmax
  correctness together, so there is no separate argmax pass and no label
  gather. At K = 1000 the rows are reduced in blocks of 25 classes (XLA:CPU
  reduces uint32 rows wider than 32 about 10x slower), which leaves the
  `[N, K/25]` uint32 keys seen in the XLA temp column; reading those back
  costs about 0.2x the floor, and the blocked key reduction alone about
  1.3x. The floor itself moves between processes at this size (11-17 ms for
  the same 381 MiB array, with `ece` moving with it), so this ratio has
  ranged from 0.89x to 1.6x over runs.
- (1,000,000, 10) misses the 1.5x target: with 10 floats per row, the
  per-row work after the read (bin index, then one scatter-add per row;
  XLA:CPU scatter is a scalar loop of about 1 ns per row) costs about 0.6x
  the floor. Tried and kept: the packed-key reduction above; one number per
  row (`c - a`) for the default `p = 1` instead of three; 8 interleaved
  accumulator lanes per block of 2048 rows (breaks the store-to-load chains
  of consecutive rows in the same bin: 2x faster on confidences near 1);
  binning by one multiplication when it is provably exact for the
  (edges, M) pair, instead of M comparisons. Tried and dropped (slower):
  `jnp.argmax` + `take_along_axis`, a variadic (max, argmax) reduction,
  per-bin masked sums (XLA materialises the `[bins, N]` mask), a one-hot
  matmul, three separate scatters. Every remaining XLA:CPU formulation is
  timed side by side by `benchmarks/ece_alternatives.py` (section "ECE
  alternatives at (1e6, 10)"): writing the per-row gap and bin alone already
  costs about 1.5x the floor, and no XLA primitive forms the 15 per-bin sums
  in less than about half the floor again.
- `classwise_ece` scatters every probability above the first bin of its
  class (the first bin comes from column totals), scanning blocks of 2**18
  elements: no `[N, K]` intermediate, 1-5 ns per element.
- `adaptive_ece` (default 'rank' rule) does not sort from 2**15 rows on:
  its bins need only the M - 1 order statistics at the group starts, found
  exactly by a three-pass radix select (11-bit digits, one scatter-add
  per pass into small histograms; on the CPU the passes run as a loop),
  then the rows are binned by M - 1
  compares and one scatter-add. At 10**6 rows this is about 6x faster than
  the sort of int32 keys it replaced (78 ms); below 2**15 rows the sort is
  kept (as fast there).
"""


def make_data(n, k, seed=0):
    """Softmax of Gaussian logits with a label boost (accuracy ~60-90%)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n).astype(np.int32)
    z = rng.normal(scale=2.0, size=(n, k)).astype(np.float32)
    z[np.arange(n), labels] += 3.5
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z, labels


# ----------------------------------------------------------------- NumPy


def np_ece(p, y):
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    b = np.minimum((conf * M).astype(np.intp), M - 1)
    s_conf = np.bincount(b, conf, M)
    s_acc = np.bincount(b, correct, M)
    return np.abs(s_conf - s_acc).sum() / len(y)


def np_adaptive_ece(p, y):
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    order = np.argsort(conf, kind="stable")
    b = (np.arange(len(y)) * M) // len(y)
    s_conf = np.bincount(b, conf[order], M)
    s_acc = np.bincount(b, correct[order], M)
    return np.abs(s_conf - s_acc).sum() / len(y)


def np_classwise_ece(p, y):
    n, k = p.shape
    b = np.minimum((p * M).astype(np.int32), M - 1)
    b += (M * np.arange(k, dtype=np.int32))[None, :]
    s_conf = np.bincount(b.ravel(), p.ravel(), k * M)
    s_acc = np.bincount(b[np.arange(n), y], minlength=k * M)
    return np.abs(s_conf - s_acc).sum() / (n * k)


NUMPY = {
    "ece": np_ece,
    "adaptive_ece": np_adaptive_ece,
    "classwise_ece": np_classwise_ece,
}


# ------------------------------------------------------------- measuring


def _once(fn):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def interleaved_medians(fns: dict, *, rounds: int, min_time: float = 0.05):
    """Median seconds per call of each fn, timed round-robin."""
    inner = {}
    for name, fn in fns.items():
        _once(fn)  # compile / warm up
        once = max(_once(fn), 1e-6)
        inner[name] = max(1, int(min_time / once))
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner[name]):
                jax.block_until_ready(fn())
            samples[name].append((time.perf_counter() - start) / inner[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def xla_temp_bytes(jitted, *args) -> int:
    analysis = jitted.lower(*args).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes) if analysis is not None else -1


def numpy_peak_bytes(fn) -> int:
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def streaming_check(total=10_000_000, batches=100, k=10):
    probs, labels = make_data(total, k, seed=1)
    one_shot = jax.jit(lambda p, y: metrics.BinnedStats.from_batch(p, y))(probs, labels)
    step = jax.jit(lambda s, p, y: s.merge(metrics.BinnedStats.from_batch(p, y)))
    stats = metrics.BinnedStats.empty()
    for p, y in zip(np.split(probs, batches), np.split(labels, batches)):
        stats = step(stats, p, y)
    state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(stats))
    same_counts = bool(
        np.array_equal(stats.count, one_shot.count)
        and np.array_equal(stats.sum_correct, one_shot.sum_correct)
    )
    return {
        "one_shot": float(one_shot.compute()),
        "merged": float(stats.compute()),
        "same_counts": same_counts,
        "state_bytes": state_bytes,
        "total": int(stats.total),
    }


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0))
    return (
        f"{nproc}-core CPU (`nproc` = {nproc}, {cpu}), backend "
        f"{jax.default_backend()}, jax {jax.__version__}, numpy {np.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )


def measure(n: int, k: int, rounds: int) -> list[dict]:
    """Times and memory of the three metrics, NumPy and the floor at (N, K)."""
    probs_np, labels_np = make_data(n, k)
    probs, labels = jnp.asarray(probs_np), jnp.asarray(labels_np)
    floor = jax.jit(lambda p: p.max(axis=1))
    jitted = {name: jax.jit(metrics.get_metric(name)) for name in NUMPY}
    fns = {"floor": lambda: floor(probs)}
    for name, fn in jitted.items():
        fns[name] = lambda fn=fn: fn(probs, labels)
        fns["np_" + name] = lambda f=NUMPY[name]: f(probs_np, labels_np)
    times = interleaved_medians(fns, rounds=rounds)
    out = []
    for name, fn in jitted.items():
        out.append(
            {
                "n": n,
                "k": k,
                "name": name,
                "ms": times[name] * 1e3,
                "floor_ms": times["floor"] * 1e3,
                "np_ms": times["np_" + name] * 1e3,
                "temp": xla_temp_bytes(fn, probs, labels),
                "np_peak": numpy_peak_bytes(
                    lambda f=NUMPY[name]: f(probs_np, labels_np)
                ),
                "input": probs_np.nbytes,
            }
        )
    return out


EAGER_TARGET = 1.5
EAGER_NOTES = """\
Notes:

- One transfer per call: both columns include the caller's `float()` of the
  value. The eager call fetches the value with its check summary in one
  `jax.device_get` (`calib_jax._checks.fetch`); the fetched array keeps its
  host copy, so the `float()` reads it without a second round trip
  (`tests/test_transfers.py`). On this CPU a fetch costs next to nothing;
  on a GPU each separate fetch is a synchronising round trip.

- Before this change the eager call ran a separate compiled value check
  (row reductions over K with masked selects, about 350 ms of the 470 ms
  eager `ece` at (1e5, 1000)) and then the metric. Now the metric's own
  packed-key row reduction also sums the screened values `p + 2|p|*2**127`
  for `p < 0` (a negative, NaN or inf entry makes the row sum NaN or huge), so
  the screen reads `probs` in the same loop as the metric; only a flagged
  row runs the exact old summary, which words the message. `classwise_ece`
  (and `marginal_ece` with equal-width bins) reads `probs` through its own
  scatter kernel, whose row blocks also return their screened row sums
  (column adds for K <= 32, a matrix-vector product above); with
  equal-mass bins the screen is one extra fused (key, sum) row reduction.
- A plain `jnp.sum` of the screened values (or of `jnp.where(p >= 0, p, inf)`)
  over rows does not vectorise on XLA:CPU: 450-900 ms at (1e5, 1000), 10-20x a
  plain row sum; inside the variadic (key max, sum) reduction the same
  arithmetic costs 0-30%.
- First-call compile. The radix select of `adaptive_ece` runs its three
  passes, and the digit search inside each, as loops on the CPU (each body
  compiled once): 0.17-0.23 s of compilation instead of 0.41-0.48 s for the
  unrolled passes at the same run time (off the CPU they stay unrolled: the
  TPU compile of the loops reads twice the bytes). The value screen's three
  counts over `N` rows are one variadic reduction instead of three
  `jnp.sum`s (XLA:CPU rewrites each long sum into its own tree of
  reductions: 0.09 s of compile and 0.8 ms at 10**6 rows for three, against
  0.03 s and 0.2 ms for the variadic one). Before these two changes:
  `adaptive_ece` 0.80 s at (1e6, 10), 0.70-1.39 s at (1e5, 1000).
- The margins are thin. In a run with another job on the machine (load
  1.7) `classwise_ece` at (1e5, 1000) compiled in 0.50 s and `adaptive_ece`
  in 0.45-0.47 s; `ece` at (1e6, 10) is 1.25-1.45x over runs, about 1.3 ms of
  host work on a 3-5 ms metric.
"""
COMPILE_TARGET = 0.5


def _first_call(fn) -> tuple[float, float]:
    """Wall and process-CPU seconds of one call (the first: compile included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - wall, time.process_time() - cpu


def eager_vs_jit(rounds: int) -> list[dict]:
    """Eager (checked) vs jitted time and first-call cost of the three metrics."""
    out = []
    for n, k in TARGET_SIZES:
        probs_np, labels_np = make_data(n, k)
        probs, labels = jnp.asarray(probs_np), jnp.asarray(labels_np)
        fns, first = {}, {}
        for name in NUMPY:
            eager = metrics.get_metric(name)
            jitted = jax.jit(eager)
            # As users call them: the value read on the host (float()).
            fns[name] = lambda f=eager: float(f(probs, labels))
            fns["jit_" + name] = lambda f=jitted: float(f(probs, labels))
            first[name] = _first_call(fns[name])
            first["jit_" + name] = _first_call(fns["jit_" + name])
        times = interleaved_medians(fns, rounds=rounds)
        for name in NUMPY:
            eager_bits = np.asarray(fns[name]()).tobytes()
            same = eager_bits == np.asarray(fns["jit_" + name]()).tobytes()
            out.append(
                {
                    "n": n,
                    "k": k,
                    "name": name,
                    "eager_ms": times[name] * 1e3,
                    "jit_ms": times["jit_" + name] * 1e3,
                    "first_s": first[name][0],
                    "first_cpu_s": first[name][1],
                    "steady_s": times[name],
                    "jit_first_s": first["jit_" + name][0],
                    "same": same,
                }
            )
            print(out[-1], flush=True)
    return out


def eager_section(rows: list[dict], load: str) -> str:
    header = (
        "| N | K | metric | eager ms | jit ms | eager / jit | first eager call s "
        "(wall) | first call CPU s | compile s (first - steady) | same bits |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines, verdicts = [], []
    for r in rows:
        ratio = r["eager_ms"] / r["jit_ms"]
        compile_s = r["first_s"] - r["steady_s"]
        lines.append(
            f"| {r['n']:,} | {r['k']} | {r['name']} | {r['eager_ms']:.2f} | "
            f"{r['jit_ms']:.2f} | {ratio:.2f}x | {r['first_s']:.2f} | "
            f"{r['first_cpu_s']:.2f} | {compile_s:.2f} | {r['same']} |"
        )
        verdicts.append(
            f"{r['name']} ({r['n']:,}, {r['k']}): eager/jit {ratio:.2f}x "
            f"({'met' if ratio <= EAGER_TARGET else 'not met'}), compile "
            f"{compile_s:.2f} s ({'met' if compile_s <= COMPILE_TARGET else 'not met'})"
        )
    return "\n".join(
        [
            f"Machine: {machine()}.",
            "",
            load,
            "",
            "Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/metrics.py"
            + " --only eager`",
            "",
            (
                "Eager = `float(metric(probs, labels))` on concrete arrays, its "
                "input checks included (static checks, then one compiled program "
                "that computes the metric and the value screen together, both "
                "fetched in one transfer; the host raises from the screen). jit "
                "= `float()` of `jax.jit` of the same call (the traced call "
                "checks shapes only). Median per call over "
                "interleaved rounds, one run. First call: the first eager call "
                "at that shape in the process (tracing + compile + one run); "
                "compile = first call minus the steady eager call. same bits: "
                "the eager and jitted values are bit-identical."
            ),
            "",
            header,
            *lines,
            "",
            f"Targets (eager within {EAGER_TARGET}x of jit; first-call compile at "
            f"most {COMPILE_TARGET} s): " + "; ".join(verdicts) + ".",
            "",
            EAGER_NOTES,
        ]
    )


def _row(r: dict) -> str:
    mib = 2.0**20
    return (
        f"| {r['n']:,} | {r['k']} | {r['name']} | {r['ms']:.2f} | "
        f"{r['floor_ms']:.2f} | {r['ms'] / r['floor_ms']:.2f}x | "
        f"{r['np_ms']:.1f} | {r['np_ms'] / r['ms']:.1f}x | {r['temp'] / mib:.2f} | "
        f"{r['np_peak'] / mib:.1f} | {r['input'] / mib:.0f} |"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--only", choices=("eager",), help="run one part (its own section) only"
    )
    args = parser.parse_args(argv)

    load_start = os.getloadavg()[0]
    if args.only == "eager":
        rows = eager_vs_jit(args.rounds)
        load = (
            f"Shared machine: 1-minute load average {load_start:.1f} at the start "
            f"and {os.getloadavg()[0]:.1f} at the end of the run ({os.cpu_count()} "
            "cores; other sessions ran at the same time, so absolute times and "
            "compile times are inflated; the ratios come from one interleaved run)."
        )
        body = eager_section(rows, load)
        if not args.no_write:
            write_section("Metrics: eager calls vs jax.jit", body)
        print(body)
        return
    rows, verdicts = [], []
    for n, k in SIZES:
        rounds = args.rounds if n * k <= 10**7 else max(3, args.rounds // 2)
        for r in measure(n, k, rounds):
            rows.append(_row(r))
            print(rows[-1], flush=True)
            if r["name"] == "ece" and (n, k) in TARGET_SIZES:
                ratio = r["ms"] / r["floor_ms"]
                met = "met" if ratio <= TARGET else "not met"
                verdicts.append(f"(N, K) = ({n:,}, {k}): {ratio:.2f}x ({met})")

    stream = streaming_check()
    print(stream, flush=True)
    header = (
        "| N | K | metric | calib_jax ms | floor ms | / floor | NumPy ms | "
        "NumPy / calib_jax | XLA temp MiB | NumPy peak MiB | input MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    target = (
        f"Target (equal-width `ece` within {TARGET}x of the floor): "
        + "; ".join(verdicts)
        + "."
    )
    streaming = (
        f"Streaming: {stream['total']:,} samples (K = 10) in 100 batches of "
        f"`BinnedStats` (state {stream['state_bytes']} bytes): merged ECE "
        f"{stream['merged']:.7f}, one-shot {stream['one_shot']:.7f}, "
        f"counts identical: {stream['same_counts']}."
    )
    load = (
        f"1-minute load average {load_start:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end of the run (2 cores; above 2 means "
        "other processes shared the CPU, which inflates every column alike)."
    )
    body = "\n".join(
        [
            f"Machine: {machine()}.",
            "",
            load,
            "",
            "Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/metrics.py`",
            "",
            (
                "Median time per call after compilation (interleaved rounds); "
                "floor = `jax.jit(lambda p: p.max(axis=1))` on the same array "
                "(one read of `probs`). XLA temp = temporary buffers of the "
                "compiled metric beyond its inputs; NumPy peak = `tracemalloc` "
                "peak of one call. num_bins = 15, default convention."
            ),
            "",
            header,
            *rows,
            "",
            target,
            "",
            streaming,
            "",
            NOTES,
        ]
    )
    if not args.no_write:
        write_section("Metrics", body)
    print(body)


if __name__ == "__main__":
    main()
