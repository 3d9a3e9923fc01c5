"""Kernel portability: both formulations of every tuned kernel compiled for TPU.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python benchmarks/tpu_kernels.py`` (needs
libtpu: ``pip install 'calib-jax[tpu-aot]'``; no TPU is used; 24 minutes on 2
CPU cores shared with other jobs, most of it compiling TPU sorts; while
another process holds libtpu's lock file, set ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``
as only compiles run). Every kernel family of :mod:`calib_jax.kernels` is
compiled ahead of time for one chip of a TPU v5e topology, once forced to
``'tuned'`` and once to ``'plain'``, at realistic sizes; XLA's cost analysis of the compiled program gives flops,
bytes accessed and its time estimate. A family runs ``'plain'`` off the CPU
when, at any of its sizes, the tuned kernel's bytes accessed exceed twice the
plain one's or the tuned kernel does not compile; other families nested in a
measured kernel take their ``kernels.FAMILIES[...].tpu`` entry (``'auto'`` on TPU), so
the table is a fixed point of this script. Writes the section "Kernel
portability (TPU ahead-of-time compile)" of benchmarks/RESULTS.md and checks
that ``calib_jax.kernels.FAMILIES[...].tpu`` holds these decisions (``--no-write``
prints only).

XLA's cost analysis counts the body of a while loop once, whatever its trip
count. The two tuned kernels that loop over row blocks (the class-wise
accumulation and the temperature-scaling exp sums) are therefore compiled at
the size of one block, and their figures are scaled by the number of rows
over the block's rows; the table marks them. Other loops (binary searches of
``jnp.searchsorted``) are listed in the ``loops`` column: their bodies are
counted once in both formulations alike.

Importable: :func:`rows` returns the measured rows, :func:`decisions` the
per-family choice, :func:`compile_cost` compiles one function for a device.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
from _timing import machine_line, write_section

from calib_jax import kernels, losses
from calib_jax.losses import _aurc, _base
from calib_jax.metrics import (
    _adaptive,
    _binned_stats,
    _common,
    _conventions,
    _cpu_kernels,
    _ood,
)
from calib_jax.posthoc import _cpu_kernels as _posthoc_cpu_kernels
from calib_jax.posthoc import _temperature

TITLE = "Kernel portability (TPU ahead-of-time compile)"
TOPOLOGY = "v5e:2x2"
INSTALL = "pip install 'calib-jax[tpu-aot]'"
# Tuned bytes accessed above this multiple of the plain ones: plain off CPU.
RATIO = 2.0
CONVENTION = _conventions.PRESETS["calib_jax"]
NUM_BINS = 15

f32, i32, b1 = jnp.float32, jnp.int32, jnp.bool_


def tpu_device(topology: str = TOPOLOGY):
    """The first device of a TPU topology description (no TPU needed).

    Exits with one line naming the install command when libtpu is missing.
    """
    if importlib.util.find_spec("libtpu") is None:
        raise SystemExit(f"libtpu is not installed; install it with: {INSTALL}")
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(f"No TPU topology {topology!r} from libtpu: {first}") from e
    return topo.devices[0]


def compile_cost(fn: Callable, specs, device) -> dict:
    """Compiles ``jit(fn)`` for ``device`` at ``specs`` ((shape, dtype) pairs).

    Returns:
      ``{'ok', 'flops', 'bytes', 'seconds', 'loops', 'argument_bytes',
      'error'}``: XLA's cost analysis of the compiled program (``seconds`` is
      its time estimate), the number of while loops left in it, the bytes its
      arguments occupy on the device (the memory analysis: the arrays in the
      device's layout, padding included), or ``ok=False`` with the first line
      of the error.
    """
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in specs]
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - a failed compile is a result
        text = str(e).strip()
        line = text.splitlines()[0] if text else type(e).__name__
        return {"ok": False, "error": f"{type(e).__name__}: {line[:160]}"}
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0]
    return {
        "ok": True,
        "flops": float(cost.get("flops", 0.0)),
        "bytes": float(cost.get("bytes accessed", 0.0)),
        "seconds": float(cost.get("optimal_seconds", float("nan"))),
        "loops": compiled.as_text().count(" while("),
        "argument_bytes": float(compiled.memory_analysis().argument_size_in_bytes),
        "error": "",
    }


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel at one size.

    ``specs(n)`` gives the argument (shape, dtype) pairs for ``n`` rows; a
    tuned kernel that loops over blocks of ``tuned_block`` rows is compiled
    at one block and scaled by ``rows / tuned_block``.
    """

    family: str
    label: str
    fn: Callable
    specs: Callable[[int], list]
    rows: int
    tuned_block: int | None = None


def _grad_sum(loss: Callable) -> Callable:
    """``(logits, labels) -> value_and_grad`` of the summed loss (logits)."""
    return jax.value_and_grad(lambda z, y: jnp.sum(loss(z, y)))


def _logits(k):
    return lambda n: [((n, k), f32), ((n,), i32)]


def _rows_case(b, k, label, **flags):
    def fn(z, y):
        stats = _base.row_stats(z, y, **flags)
        return sum(jnp.sum(v) for v in stats if v is not None)

    return Case(
        "loss_rows", f"{label}, B x K = {b} x {k}", _grad_sum(fn), _logits(k), b
    )


def _nll_objective(z, y, u):
    w = jnp.full(z.shape[:1], 1.0 / z.shape[0], z.dtype)
    return _temperature.nll_objective(z, y, w)(u)


def _top_conf_objective(z, y, u):
    del y
    zs = jax.lax.stop_gradient(z)
    return jnp.sum(_temperature.top_confidence_of_log_t(u, zs, jnp.max(zs, axis=-1)))


def cases() -> list[Case]:
    """Every kernel family at realistic sizes."""
    out = []
    for n, k in ((1_000_000, 10), (100_000, 1000)):
        out.append(
            Case(
                "metric_top_label",
                f"top_label, N x K = {n:,} x {k}",
                _common.top_label,
                _logits(k),
                n,
            )
        )
    for n in (1_000_000,):
        out.append(
            Case(
                "sort_keys",
                f"sorted_by_confidence, N = {n:,}",
                _common.sorted_by_confidence,
                lambda n: [((n,), f32), ((n,), b1), ((n,), b1)],
                n,
            )
        )
    out.append(
        Case(
            "sort_keys",
            "ood_auroc ranks, N_in = N_out = 100,000",
            _ood.ranks,
            lambda n: [((n,), f32), ((n,), f32), ((n,), b1)],
            100_000,
        )
    )
    out.append(
        Case(
            "sort_keys",
            "aurc loss tie groups, B = 4096",
            _aurc.tie_groups,
            lambda n: [((n,), f32)],
            4096,
        )
    )
    for n, k in ((1_000_000, 10), (100_000, 1000)):
        out.append(
            Case(
                "metric_classwise",
                f"accumulate_classwise, N x K = {n:,} x {k}, 15 bins",
                lambda p, y, v: _binned_stats.accumulate_classwise(
                    p, y, v, num_bins=NUM_BINS, convention=CONVENTION
                ),
                lambda n, k=k: [((n, k), f32), ((n,), i32), ((n,), b1)],
                n,
                tuned_block=_cpu_kernels.CLASSWISE_BLOCK // k,
            )
        )
    for n in (1_000_000,):
        out.append(
            Case(
                "metric_radix_select",
                f"'rank' equal-mass stats, N = {n:,}, 15 bins",
                lambda c, a, v: _adaptive.rank_stats(c, a, v, num_bins=NUM_BINS),
                lambda n: [((n,), f32), ((n,), b1), ((n,), b1)],
                n,
            )
        )
    for b, k in ((4096, 1000), (128, 10)):
        size = f"B x K = {b} x {k}, forward+backward"
        every = {"ce": True, "conf": True, "entropy": True, "margin": True}
        out.append(_rows_case(b, k, "ce, conf, entropy, margin", **every))
        out.append(_rows_case(b, k, "conf (sb_ece)", conf=True))
        for fam, name, loss in (
            ("loss_true_vs_rest", "focal", losses.focal),
            ("loss_true_vs_rest", "brier", losses.brier),
            ("loss_dual_focal", "dual_focal", losses.dual_focal),
            ("loss_mbls", "mbls", losses.mbls),
            ("loss_acls", "acls", losses.acls),
        ):
            out.append(Case(fam, f"{name}, {size}", _grad_sum(loss), _logits(k), b))
    for n, k in ((50_000, 1000), (10_000, 10)):
        specs = lambda n, k=k: [((n, k), f32), ((n,), i32), ((), f32)]
        block = _posthoc_cpu_kernels.block_rows(n, k)
        out.append(
            Case(
                "posthoc_temperature",
                f"NLL in log T, value and grad, N x K = {n:,} x {k}",
                jax.value_and_grad(_nll_objective, argnums=2),
                specs,
                n,
                tuned_block=block if block < n else None,
            )
        )
    n, k = 50_000, 1000
    out.append(
        Case(
            "posthoc_temperature",
            f"top-label confidences in log T, value and grad, N x K = {n:,} x {k}",
            jax.value_and_grad(_top_conf_objective, argnums=2),
            lambda n, k=k: [((n, k), f32), ((n,), i32), ((), f32)],
            n,
            tuned_block=_posthoc_cpu_kernels.block_rows(n, k),
        )
    )
    return out


def measure(case: Case, device) -> dict:
    """Both formulations of one case: a row of the results table."""
    row = {"family": case.family, "case": case.label}
    for mode in ("tuned", "plain"):
        n = case.rows
        if mode == "tuned" and case.tuned_block is not None:
            n = case.tuned_block
        start = time.perf_counter()
        with kernels.use(mode, case.family):
            cost = compile_cost(case.fn, case.specs(n), device)
        cost["compile_s"] = time.perf_counter() - start
        scale = case.rows / n
        if cost["ok"]:
            for key in ("flops", "bytes", "seconds"):
                cost[key] *= scale
        cost["scaled"] = scale != 1.0
        row[mode] = cost
    t, p = row["tuned"], row["plain"]
    row["ratio"] = t["bytes"] / p["bytes"] if t["ok"] and p["ok"] else float("nan")
    return row


def rows(device=None, only: set[str] | None = None) -> list[dict]:
    """Measures every case (or the families in ``only``) on ``device``."""
    device = tpu_device() if device is None else device
    out = []
    for case in cases():
        if only and case.family not in only:
            continue
        out.append(measure(case, device))
        r = out[-1]
        print(
            f"{r['family']:24s} {r['case'][:58]:58s} ratio {r['ratio']:8.3f} "
            f"({r['tuned']['compile_s']:.0f} s + {r['plain']['compile_s']:.0f} s)",
            flush=True,
        )
    return out


def decisions(measured: list[dict]) -> dict[str, tuple[str, str]]:
    """Per family ``(choice, reason)``: ``'plain'`` when the tuned kernel fails
    to compile or its bytes exceed :data:`RATIO` times the plain ones at any
    size."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in measured):
        group = [r for r in measured if r["family"] == family]
        failed = [r["case"] for r in group if not r["tuned"]["ok"]]
        worst = max(r["ratio"] for r in group if r["tuned"]["ok"] and r["plain"]["ok"])
        if failed:
            out[family] = ("plain", f"tuned does not compile ({failed[0]})")
        elif worst > RATIO:
            out[family] = ("plain", f"tuned bytes {worst:.2f}x plain")
        else:
            out[family] = ("tuned", f"tuned bytes at most {worst:.2f}x plain")
    return out


def _fmt(cost: dict, key: str, unit: float, digits: int) -> str:
    if not cost["ok"]:
        return "fails"
    if not cost[key] >= 0:  # the estimate overflows on some scatters
        return "n/a"
    mark = "*" if cost["scaled"] else ""
    return f"{cost[key] / unit:.{digits}f}{mark}"


def report(measured: list[dict], device) -> str:
    """The RESULTS.md section body."""
    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = "unknown"
    target = (
        f"Target: {device.device_kind} (topology `{TOPOLOGY}`, one chip), compiled "
        f"ahead of time with libtpu {libtpu} on a CPU host (no TPU run). "
        f"Host: {machine_line()}."
    )
    method = (
        "Each kernel family of `calib_jax.kernels` compiled for TPU once as the "
        "CPU-tuned kernel and once as its plain jnp formulation "
        "(`kernels.use(mode, family)`); figures from XLA's cost analysis of the "
        "compiled program (GB = 1e9 bytes accessed; est. = its time estimate, "
        "n/a where the estimate comes out negative, as for some scatter-adds). "
        "`*`: the tuned kernel loops over row blocks and XLA counts a loop "
        "body once, so it was compiled at one block and scaled by the number "
        "of rows over the block's. `loops` = while loops left in the compiled "
        "tuned / plain program (binary searches; their bodies are counted once "
        "in both). Losses and post-hoc objectives are value and gradient. "
        "Other families inside a measured kernel take their `kernels.FAMILIES` "
        "entry, as on a TPU."
    )
    header = (
        "| family | case | tuned GB | plain GB | tuned / plain bytes | tuned GFLOP "
        "| plain GFLOP | est. us tuned | est. us plain | loops |"
    )
    lines = [
        target,
        "",
        "Command: `JAX_PLATFORMS=cpu .venv/bin/python benchmarks/tpu_kernels.py`",
        "",
        method,
        "",
        header,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in measured:
        t, p = r["tuned"], r["plain"]
        loops = f"{t.get('loops', '-')} / {p.get('loops', '-')}"
        lines.append(
            f"| {r['family']} | {r['case']} | {_fmt(t, 'bytes', 1e9, 4)} | "
            f"{_fmt(p, 'bytes', 1e9, 4)} | {r['ratio']:.2f} | "
            f"{_fmt(t, 'flops', 1e9, 3)} | {_fmt(p, 'flops', 1e9, 3)} | "
            f"{_fmt(t, 'seconds', 1e-6, 1)} | {_fmt(p, 'seconds', 1e-6, 1)} | {loops} |"
        )
    rule = (
        f"Decision (off the CPU; tuned bytes > {RATIO:g}x plain at any size, or "
        "no compile, selects plain). GPUs take the same column: no GPU was "
        "measured. On the CPU every family stays tuned."
    )
    lines += [
        "",
        rule,
        "",
        "| family | off-CPU choice | why | `kernels.FAMILIES[...].tpu` |",
        "|---|---|---|---|",
    ]
    for family, (choice, why) in decisions(measured).items():
        table = (
            kernels.FAMILIES[family].tpu if family in kernels.FAMILIES else "missing"
        )
        note = table if table == choice else f"{table} (DIFFERS)"
        lines.append(f"| {family} | {choice} | {why} | {note} |")
    for r in measured:
        for mode in ("tuned", "plain"):
            if not r[mode]["ok"]:
                lines.append(f"\n{r['case']} ({mode}): {r[mode]['error']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated families")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    only = {f for f in args.only.split(",") if f}
    for f in only:
        if f not in kernels.FAMILIES:
            raise SystemExit(
                f"--only: unknown family {f!r}; known: {', '.join(kernels.FAMILIES)}."
            )
    device = tpu_device()
    measured = rows(device, only or None)
    body = report(measured, device)
    print(body)
    mismatch = [
        f for f, (c, _) in decisions(measured).items() if kernels.FAMILIES[f].tpu != c
    ]
    if not (args.no_write or only):
        write_section(TITLE, body)
    if mismatch:
        print(
            f"kernels.FAMILIES[...].tpu differs from the measurement for: {', '.join(mismatch)}"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
