"""The calibration-under-shift benchmark: methods x calibrators x seeds x shifts.

``python -m calib_jax.benchmark --config configs/benchmark_digits.py --workdir DIR``
trains every method of the grid (resuming finished cells), fits every post-hoc
calibrator on the validation logits, scores the clean and every shifted test
set, and writes ``results.jsonl``, ``report.md`` and PNG plots under ``DIR``.
"""

from calib_jax.benchmark.grid import CALIBRATORS, METHODS
from calib_jax.benchmark.report import aggregate, claims, write_report
from calib_jax.benchmark.runner import run

__all__ = ["CALIBRATORS", "METHODS", "aggregate", "claims", "run", "write_report"]
