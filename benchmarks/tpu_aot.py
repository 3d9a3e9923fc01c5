"""Compiles the trainer's sharded train step ahead of time for TPU slices, from a CPU.

Usage (from the repository root, on any machine; no TPU needed)::

  pip install 'calib-jax[tpu-aot]'   # libtpu==0.0.42.*, the release built with jax 0.10.2
  python benchmarks/tpu_aot.py       # every shipped CIFAR config -> RESULTS.md
  python benchmarks/tpu_aot.py --topologies v5e:2x2 --configs cifar10_wrn28_10 \\
      --objectives ce,sb_ece --no-write
  python benchmarks/tpu_aot.py --grid --configs benchmark_cifar10 \\
      --objectives sb_ece,mmce       # methods of the benchmark grids

For every shipped CIFAR training config (``configs/cifar*.py``) with the
calibration objective its documented command names, on every topology
(default v5e 2x2, 4x4, 16x16 and v5p 2x2x1), and as shipped (cross-entropy)
on ``--ce-topologies`` (default v5e:16x16), it builds the step with the
trainer's own builder (:func:`calib_jax.train.sharded_step.build_sharded_step`:
model, loss terms, optimizer, shardings, donation) on a ``"data"`` mesh of the
topology's devices, lowers it for the config's global batch and compiles it
with libtpu. It records per-device memory against the chip's HBM, the model
FLOPs (:func:`calib_jax.models.train_step_flops`), FLOPs and bytes accessed
from the cost analysis, a roofline step time and images/s, and
the collectives of the compiled HLO. A global batch the slice cannot split
evenly is raised to the next multiple of its device count (marked in the
table). Writes the ``## TPU ahead-of-time compile`` section of
benchmarks/RESULTS.md after every compile (``--no-write``: print only).

``--kernels`` compiles both formulations of every CPU-tuned kernel instead
(``benchmarks/tpu_kernels.py``, the table behind ``calib_jax.kernels``).

``--grid`` compiles the methods of the ``configs/benchmark_cifar*.py`` grids
instead (WRN-28-10, batch 512; default topology v5e:16x16; ``--objectives``
picks methods) into the ``## TPU ahead-of-time compile: benchmark grid``
section.

Exits 1 if a step does not compile, and 2 with one line naming the install
command if libtpu is missing. A compile takes 0.5-2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
# Compiling for a described TPU slice needs only the CPU backend (and libtpu
# for the topology); do not try to open a local TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _tpu

TOPOLOGIES = ("v5e:2x2", "v5e:4x4", "v5e:16x16", "v5p:2x2x1")
GRID_TOPOLOGIES = ("v5e:16x16",)
CE_TOPOLOGIES = ("v5e:16x16",)
GRID_SECTION = "TPU ahead-of-time compile: benchmark grid"
# Training images per epoch of the CIFAR configs (50000 minus the 5000 of val);
# only the schedule's step boundaries depend on it, not the compiled step's cost.
CIFAR_TRAIN_IMAGES = 45_000
SECTION = "TPU ahead-of-time compile"


def shipped_configs() -> list[str]:
    """Names of the shipped CIFAR training configs (``configs/cifar*.py``)."""
    return sorted(p.stem for p in (ROOT / "configs").glob("cifar*.py"))


def benchmark_configs() -> list[str]:
    """Names of the shipped CIFAR benchmark configs (``configs/benchmark_cifar*.py``)."""
    return sorted(p.stem for p in (ROOT / "configs").glob("benchmark_cifar*.py"))


def own_objectives(name: str) -> tuple[str, ...]:
    """The objective(s) named in config ``name``'s documented command (else ``ce``)."""
    doc = importlib.import_module(f"configs.{name}").__doc__ or ""
    return tuple(dict.fromkeys(re.findall(r":objective=(\w+)", doc))) or ("ce",)


def training_work(configs, objectives, topologies, ce_topologies) -> list:
    """``((config, objective, ConfigDict), topology)`` pairs to compile.

    Each config with ``objectives`` (default: its own, :func:`own_objectives`)
    on every topology, and as shipped (``ce``) on ``ce_topologies``; the
    ``ce_topologies`` pairs come first.
    """

    def entry(name, objective):
        module = importlib.import_module(f"configs.{name}")
        return name, objective, module.get_config(f"objective={objective}")

    first, rest = [], []
    for name in configs:
        for objective in objectives or own_objectives(name):
            for t in topologies:
                pair = (entry(name, objective), t)
                (first if t in ce_topologies else rest).append(pair)
        if not objectives and "ce" not in own_objectives(name):
            first += [(entry(name, "ce"), t) for t in ce_topologies]
    return first + rest


def grid_entries(configs, methods) -> list[tuple[str, str, object]]:
    """``(config, method, ConfigDict)`` of the benchmark grids' methods.

    Args:
      configs: benchmark config names (``configs/benchmark_cifar*.py``).
      methods: the methods to take (default: every method of each grid).

    MaC-Cal stage II (``two_stage``) is left out: its step needs the stage-I
    run's features and is a two-layer head on them, far smaller than the
    stage-I (``ce``) step; so are deep ensembles (``ensemble(<method>)``),
    which train nothing of their own.
    """
    from calib_jax.benchmark import grid

    out = []
    for name in configs:
        config = importlib.import_module(f"configs.{name}").get_config("seeds=1")
        for method in methods or config.methods:
            if method == "two_stage" or grid.ensemble_of(method):
                continue
            cell = grid.train_config(config, method, 0, Path("/nonexistent"))
            out.append((name, method, cell))
    return out


def compile_entry(config, topology: str):
    """Compiles the step(s) of ``config`` for ``topology``.

    Returns:
      ``(analyses, global_batch, seconds, model_flops)``: one
      :class:`_tpu.Analysis` per jitted step (two for interleaved training: the
      primary and the secondary objective's step), and the model FLOPs of one
      step per device (:func:`calib_jax.models.train_step_flops` at the
      per-device batch).
    """
    from calib_jax import data, models
    from calib_jax.train import sharded_step

    mesh = _tpu.topology_mesh(topology)
    chip = _tpu.chip_of(topology)
    config = config.copy_and_resolve_references()
    batch = _tpu.smallest_multiple(config.batch_size, mesh.devices.size)
    config.batch_size = batch
    steps_per_epoch = math.ceil(CIFAR_TRAIN_IMAGES / batch)
    num_steps = max(math.ceil(config.num_epochs * steps_per_epoch), 1)
    if config.num_steps > 0:
        num_steps = int(config.num_steps)
    info = data.dataset_info(config.dataset.name)
    start = time.perf_counter()
    steps = sharded_step.build_sharded_step(config, info, mesh, num_steps)
    analyses = []
    for fn in (steps.train, steps.secondary):
        if fn is None:
            continue
        compiled = fn.lower(steps.abstract_state, steps.abstract_batch).compile()
        analyses.append(_tpu.analyze(compiled, chip, batch))
    seconds = time.perf_counter() - start
    model = models.from_config(config.model, num_classes=info.num_classes)
    per_device = batch // mesh.devices.size
    model_flops = models.train_step_flops(model, info.image_shape, per_device)
    return analyses, batch, seconds, model_flops


def _row(name, method, topology, devices, batch, asked, a, secs, model_flops):
    m = a.memory
    mark = "" if batch == asked else f" (asked {asked})"
    return (
        f"| {name} | {method} | {topology} ({devices}) | {batch}{mark} "
        f"| {m.argument / _tpu.GIB:.3f} / {(m.output - m.alias) / _tpu.GIB:.3f} / "
        f"{m.temp / _tpu.GIB:.3f} / {m.total / _tpu.GIB:.3f} "
        f"| {'yes' if a.fits else '**no**'} ({a.chip.hbm_bytes // _tpu.GIB} GiB) "
        f"| {model_flops / 1e9:.1f} | {a.flops / 1e9:.1f} "
        f"| {a.bytes_accessed / 1e9:.2f} "
        f"| {a.step_seconds * 1e3:.2f} | {a.images_per_second:,.0f} "
        f"| {_tpu.summarize(a.collectives)} | {secs:.0f} |"
    )


HEADER = (
    "| config | objective | topology (chips) | global batch | per-device GiB: "
    "arguments / outputs (not donated) / temporaries / total | fits HBM "
    "| model GFLOPs/device | XLA GFLOPs/device | GB accessed/device "
    "| roofline ms/step | images/s | collectives (per step, per device) "
    "| compile s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _body(rows, failures, topologies, machine, done, total) -> str:
    chips = ", ".join(
        f"{c.name} {c.hbm_bytes // _tpu.GIB} GiB HBM, {c.peak_flops / 1e12:.0f} "
        f"TFLOP/s bf16, {c.hbm_bandwidth / 1e9:.0f} GB/s"
        for c in _tpu.CHIPS.values()
    )

    lines = [
        (
            "`python benchmarks/tpu_aot.py` (needs the `tpu-aot` extra: libtpu "
            f"`{_tpu.LIBTPU_REQUIREMENT}`). Compiled ahead of time on a CPU host "
            f"({machine}; shared with other jobs, so compile seconds are indicative) "
            f"for the topologies {', '.join(topologies)}, through "
            "`jax.experimental.topologies`; nothing ran on a TPU."
        ),
        "",
        (
            "Each row is the trainer's own jitted step "
            "(`calib_jax.train.sharded_step.build_sharded_step`: model, loss terms, "
            "optimizer, state replicated and donated, batch split over a 1-axis "
            "`data` mesh of all chips) lowered for the config's global batch of "
            "CIFAR 32x32x3 images "
            "(uint8 images, converted on the device as the trainer does; "
            "float32 model as the configs ship). Memory, FLOPs and bytes are per device. "
            "Model GFLOPs = `calib_jax.models.train_step_flops` at the per-device "
            "batch (3 x 2 x the multiply-adds of the convolution and dense "
            "shapes); XLA GFLOPs and bytes are the compiled executable's "
            "`cost_analysis()`, which on TPU counts the convolutions (XLA emits "
            "them itself; on a GPU, where cuDNN runs them, it does not), and "
            "memory its `memory_analysis()`; total memory = arguments + outputs "
            "- donated aliases + temporaries + generated code. Roofline ms/step = "
            "max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) of one chip, a lower "
            "bound that ignores the collectives' time; images/s = global batch / "
            f"that time. Chip figures (Cloud TPU documentation): {chips}. "
            "Collectives are read from the compiled HLO (`as_text()`), counted "
            "once per instruction; a combined all-reduce of all gradients is one "
            "instruction. A global batch that the chips cannot split evenly is "
            "raised to the next multiple of the chip count (marked *asked N*)."
        ),
        "",
        HEADER,
        *rows,
    ]
    if failures:
        lines += ["", "Did not compile:", *(f"- {f}" for f in failures)]
    if done < total:
        lines += ["", f"*Partial: {done} of {total} compilations so far.*"]
    return "\n".join(lines) + "\n"


def _key(pair) -> tuple[str, str, str]:
    (name, method, _), topology = pair
    return name, method, topology


def existing_rows(section: str) -> list[tuple[tuple[str, str, str], str]]:
    """``((config, method, topology), line)`` of the table rows in ``section``."""
    from _timing import RESULTS

    text = RESULTS.read_text() if RESULTS.exists() else ""
    start = text.find(f"## {section}\n")
    if start < 0:
        return []
    end = text.find("\n## ", start + 1)
    out = []
    for line in text[start : end if end >= 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("config", "---"):
            continue
        method = cells[1].removesuffix(" (secondary step)")
        out.append(((cells[0], method, cells[2].split(" ")[0]), line))
    return out


def main(argv=None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--topologies",
        default="",
        help=f"default {','.join(TOPOLOGIES)} ({','.join(GRID_TOPOLOGIES)} with --grid)",
    )
    parser.add_argument(
        "--configs",
        default="",
        help="comma-separated configs/ names (default: every configs/cifar*.py)",
    )
    parser.add_argument(
        "--objectives",
        default="",
        help="comma-separated objectives (default: each config's own)",
    )
    parser.add_argument(
        "--ce-topologies",
        default=",".join(CE_TOPOLOGIES),
        help="where each config is also compiled with cross-entropy (default objectives)",
    )
    parser.add_argument("--grid", action="store_true")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="compile the tuned and plain kernel formulations (tpu_kernels.py)",
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in the section and compile only the rest",
    )
    args = parser.parse_args(argv)
    if args.kernels:
        import tpu_kernels

        return tpu_kernels.main(["--no-write"] if args.no_write else [])
    try:
        _tpu.require_libtpu()
    except _tpu.LibtpuMissing as e:
        print(e, file=sys.stderr)
        return 2
    from _timing import machine_line, write_section

    default = GRID_TOPOLOGIES if args.grid else TOPOLOGIES
    topologies = [t for t in args.topologies.split(",") if t] or list(default)
    for t in topologies:
        _tpu.chip_of(t)  # an unknown generation fails before any compile
    configs = [c for c in args.configs.split(",") if c]
    objectives = [o for o in args.objectives.split(",") if o]
    if args.grid:
        entries = grid_entries(configs or benchmark_configs(), objectives)
        work = [(e, t) for e in entries for t in topologies]
        section = GRID_SECTION
    else:
        ce_topologies = [t for t in args.ce_topologies.split(",") if t]
        work = training_work(
            configs or shipped_configs(), objectives, topologies, ce_topologies
        )
        topologies = list(dict.fromkeys([*topologies, *ce_topologies]))
        section = SECTION
    rows, failures = [], []
    if args.resume:
        kept = existing_rows(section)
        rows = [line for key, line in kept if key in {_key(w) for w in work}]
        work = [w for w in work if _key(w) not in {key for key, _ in kept}]
        print(f"Keeping {len(rows)} rows of the section; {len(work)} to compile.")
    machine = machine_line()
    for i, ((name, method, config), topology) in enumerate(work, 1):
        print(f"[{i}/{len(work)}] {name} {method} on {topology} ...", flush=True)
        try:
            analyses, batch, secs, model_flops = compile_entry(config, topology)
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            failures.append(f"{name} {method} {topology}: {type(e).__name__}: {first}")
            print(f"    FAILED: {failures[-1]}", flush=True)
            analyses = []
        devices = _tpu.topology_mesh(topology).devices.size
        for j, a in enumerate(analyses):
            label = method if j == 0 else f"{method} (secondary step)"
            rows.append(
                _row(
                    name,
                    label,
                    topology,
                    devices,
                    batch,
                    config.batch_size,
                    a,
                    secs,
                    model_flops,
                )
            )
            print(
                f"    {secs:.0f} s: {a.memory.total / _tpu.GIB:.3f} GiB/device "
                f"({'fits' if a.fits else 'DOES NOT FIT'}), "
                f"{a.flops / 1e9:.1f} GFLOPs (model {model_flops / 1e9:.1f}), "
                f"{a.bytes_accessed / 1e9:.2f} GB, "
                f"{a.step_seconds * 1e3:.2f} ms, {a.images_per_second:,.0f} img/s; "
                f"{_tpu.summarize(a.collectives)}",
                flush=True,
            )
        if not args.no_write:  # after every compile: a long run keeps its rows
            write_section(
                section, _body(rows, failures, topologies, machine, i, len(work))
            )
    print("\n" + _body(rows, failures, topologies, machine, len(work), len(work)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
