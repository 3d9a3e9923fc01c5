"""Ahead-of-time TPU compilation from a CPU host: topology meshes and analyses.

Shared by the TPU benchmarks (``benchmarks/tpu_aot.py``) and their tests.
libtpu (the ``calib-jax[tpu-aot]`` extra) lets ``jax.experimental.topologies``
describe a TPU slice without any TPU attached; a program jitted with shardings
over that slice's devices then lowers and compiles for it, and the compiled
executable reports its per-device memory, cost and HLO.

Everything here reads a ``jax.stages.Compiled`` (or its HLO text); nothing
runs on a TPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections import Counter

import numpy as np
from jax.sharding import Mesh

LIBTPU_REQUIREMENT = "libtpu==0.0.42.*"  # the libtpu release built with jax 0.10.2
INSTALL_COMMAND = "pip install 'calib-jax[tpu-aot]'"
AXIS = "data"
GIB = 2**30


class LibtpuMissing(RuntimeError):
    """libtpu is not installed, so no TPU topology can be described."""


def require_libtpu() -> None:
    """Raises :class:`LibtpuMissing` (one line with the install command) without libtpu."""
    if importlib.util.find_spec("libtpu") is None:
        raise LibtpuMissing(
            "libtpu is not installed; ahead-of-time TPU compilation needs it: "
            f"{INSTALL_COMMAND} (or pip install '{LIBTPU_REQUIREMENT}')."
        )


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip figures of a TPU generation (public Cloud TPU specifications).

    Attributes:
      name: the generation as topology names spell it (``v5e``, ``v4``, ``v5p``).
      hbm_bytes: HBM capacity per chip.
      peak_flops: peak bf16 matrix FLOP/s per chip.
      hbm_bandwidth: HBM bandwidth per chip, bytes/s.
    """

    name: str
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float


# From the "system architecture" pages of the Cloud TPU documentation
# (cloud.google.com/tpu/docs/v5e, /v4, /v5p): HBM per chip, peak bf16 TFLOP/s
# per chip, HBM bandwidth per chip.
CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", 16 * GIB, 197e12, 819e9),
    "v4": Chip("v4", 32 * GIB, 275e12, 1228e9),
    "v5p": Chip("v5p", 95 * GIB, 459e12, 2765e9),
}


def chip_of(topology: str) -> Chip:
    """The :class:`Chip` of a topology name such as ``'v5e:4x4'``.

    Raises:
      ValueError: a generation not in :data:`CHIPS`.
    """
    generation = topology.split(":", 1)[0]
    if generation not in CHIPS:
        raise ValueError(
            f"Unknown TPU generation '{generation}' in topology '{topology}'. "
            f"Valid: {', '.join(CHIPS)}."
        )
    return CHIPS[generation]


def topology_mesh(topology: str) -> Mesh:
    """A one-axis ``"data"`` mesh over the devices of a described TPU slice.

    Built with ``Mesh`` (Auto axis type) like the trainer's
    :func:`calib_jax.train.mesh.data_mesh`.

    Args:
      topology: e.g. ``'v5e:2x2'``, ``'v5e:16x16'``, ``'v5p:2x2x1'``.

    Raises:
      LibtpuMissing: libtpu is not installed.
    """
    require_libtpu()
    # libtpu takes a machine-wide lock file on load, meant for a host's real
    # TPU chips; compiling for a described slice touches no chip, so several
    # processes (benchmarks, pytest-xdist workers) may hold libtpu at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # needs libtpu

    desc = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    return Mesh(np.asarray(desc.devices), (AXIS,))


@dataclasses.dataclass(frozen=True)
class Memory:
    """Per-device memory of a compiled executable, bytes.

    ``total`` is what the executable holds at its peak: arguments, outputs
    not aliased to (donated) arguments, temporaries and the generated code.
    """

    argument: int
    output: int
    alias: int
    temp: int
    generated_code: int

    @property
    def total(self) -> int:
        """``argument + output - alias + temp + generated_code``."""
        return (
            self.argument + self.output - self.alias + self.temp + self.generated_code
        )


def memory(compiled) -> Memory:
    """The per-device :class:`Memory` of ``compiled`` (``memory_analysis()``)."""
    m = compiled.memory_analysis()
    return Memory(
        argument=int(m.argument_size_in_bytes),
        output=int(m.output_size_in_bytes),
        alias=int(m.alias_size_in_bytes),
        temp=int(m.temp_size_in_bytes),
        generated_code=int(m.generated_code_size_in_bytes),
    )


def cost(compiled) -> tuple[float, float]:
    """``(flops, bytes accessed)`` per device from ``cost_analysis()``."""
    c = compiled.cost_analysis()
    if isinstance(c, (list, tuple)):  # older jax: one dict per program
        c = c[0]
    return float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))


def roofline_seconds(flops: float, bytes_accessed: float, chip: Chip) -> float:
    """Roofline step time of one chip: ``max(flops / peak, bytes / bandwidth)``.

    A lower bound that ignores collectives, launch overheads and imperfect
    overlap; per-device figures give the step time of the whole data-parallel
    slice.
    """
    return max(flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth)


# ---- collectives in HLO text ------------------------------------------------------

COLLECTIVE_OPS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "collective-permute",
    "all-to-all",
)
_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(?P<type>.*?)\s"
    rf"(?P<op>{'|'.join(COLLECTIVE_OPS)})(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One cross-device collective instruction of an HLO module.

    Attributes:
      op: ``all-reduce``, ``all-gather``, ``reduce-scatter``,
        ``collective-permute`` or ``all-to-all``.
      shapes: the result arrays ``(dtype, dims)`` (several for a combined
        tuple collective; for an async ``-start`` op, its outputs only).
    """

    op: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def elements(self) -> int:
        """Elements of all result arrays."""
        return sum(math.prod(dims) for _, dims in self.shapes)

    @property
    def bytes(self) -> int:
        """Bytes of all result arrays."""
        return sum(_BYTES.get(t, 4) * math.prod(dims) for t, dims in self.shapes)

    @property
    def largest(self) -> int:
        """Elements of the largest single result array."""
        return max((math.prod(dims) for _, dims in self.shapes), default=0)


def collectives(hlo_text: str) -> list[Collective]:
    """The cross-device collectives of an HLO module's text.

    Reads every instruction whose opcode is one of :data:`COLLECTIVE_OPS`
    (or its async ``-start``; the matching ``-done`` is not counted again),
    e.g. from ``jax.stages.Compiled.as_text()``.

    Args:
      hlo_text: HLO text (layouts, ``/*index=N*/`` comments and metadata may
        be present).

    Returns:
      One :class:`Collective` per instruction, in text order.
    """
    out = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        kind = re.sub(r"\{[^{}]*\}|/\*.*?\*/", "", match["type"])
        shapes = [
            (dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in _ARRAY.findall(kind)
            if dtype in _BYTES
        ]
        if match["start"]:
            # An async start returns (operands..., outputs..., contexts...):
            # drop the u32/s32 scalar contexts, keep the outputs.
            context = ("u32", ())
            while len(shapes) > 1 and shapes[-1] in (context, ("s32", ())):
                shapes.pop()
            if match["op"] != "all-reduce" and len(shapes) % 2 == 0:
                shapes = shapes[len(shapes) // 2 :]
        out.append(Collective(match["op"], tuple(shapes)))
    return out


def summarize(found: list[Collective]) -> str:
    """One line per op kind: ``all-reduce 42x 36.6 MB (largest 3.7M el.)``."""
    counts = Counter(c.op for c in found)
    parts = []
    for op in COLLECTIVE_OPS:
        if not counts[op]:
            continue
        same = [c for c in found if c.op == op]
        total = sum(c.bytes for c in same)
        largest = max(c.largest for c in same)
        parts.append(
            f"{op} {counts[op]}x {_human_bytes(total)} (largest array "
            f"{_human_count(largest)} el.)"
        )
    return "; ".join(parts) if parts else "none"


def _human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def _human_count(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What one ahead-of-time compiled step reports, per device.

    Attributes:
      memory: per-device :class:`Memory`.
      flops: per-device FLOPs of one step.
      bytes_accessed: per-device bytes read and written in one step.
      collectives: the step's cross-device collectives.
      chip: the chip the figures are judged against.
      global_batch: images per step over the whole slice.
    """

    memory: Memory
    flops: float
    bytes_accessed: float
    collectives: list[Collective]
    chip: Chip
    global_batch: int

    @property
    def fits(self) -> bool:
        """Whether ``memory.total`` fits the chip's HBM."""
        return self.memory.total <= self.chip.hbm_bytes

    @property
    def step_seconds(self) -> float:
        """:func:`roofline_seconds` of the step."""
        return roofline_seconds(self.flops, self.bytes_accessed, self.chip)

    @property
    def images_per_second(self) -> float:
        """``global_batch / step_seconds`` (0 for an empty step)."""
        t = self.step_seconds
        return self.global_batch / t if t > 0 else 0.0


def analyze(compiled, chip: Chip, global_batch: int) -> Analysis:
    """The :class:`Analysis` of a compiled step on ``chip``."""
    flops, bytes_accessed = cost(compiled)
    return Analysis(
        memory=memory(compiled),
        flops=flops,
        bytes_accessed=bytes_accessed,
        collectives=collectives(compiled.as_text()),
        chip=chip,
        global_batch=global_batch,
    )


def smallest_multiple(batch: int, devices: int) -> int:
    """The smallest multiple of ``devices`` that is ``>= batch``."""
    return -(-batch // devices) * devices
