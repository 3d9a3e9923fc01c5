"""Small timing helpers shared by the benchmarks (not a test utility)."""

from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax

RESULTS = Path(__file__).with_name("RESULTS.md")


def median_seconds(
    fn: Callable[[], object], *, repeats: int = 7, min_time: float = 0.2
) -> float:
    """Median wall time of ``fn()`` after one warm-up (compile) call.

    Each sample runs ``fn`` enough times to last at least ``min_time`` seconds.
    ``fn`` must block on its result (``jax.block_until_ready``).
    """
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    inner = max(1, int(min_time / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def machine_line() -> str:
    """One line naming the machine, the software and the date of a run."""
    cpu = platform.processor() or "unknown CPU"
    try:
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"model name\s*:\s*(.+)", text)
        if match:
            cpu = match.group(1).strip()
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), backend {jax.default_backend()}, "
        f"jax {jax.__version__}, {datetime.date.today().isoformat()}"
    )


def write_section(title: str, body: str) -> None:
    """Replaces (or appends) the ``## <title>`` section of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    header = f"## {title}\n"
    section = header + body.rstrip() + "\n"
    start = text.find(header)
    if start < 0:
        text = text.rstrip() + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(header))
        # Keep the blank line that separates this section from the next one.
        rest = "\n" + text[end + 1 :] if end >= 0 else ""
        text = text[:start] + section + rest
    RESULTS.write_text(text)
