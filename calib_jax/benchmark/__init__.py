"""The calibration-under-shift benchmark: methods x calibrators x seeds x shifts.

``python -m calib_jax.benchmark --config configs/benchmark_digits.py --workdir DIR``
trains every method of the grid (resuming finished cells), fits every post-hoc
calibrator on the validation logits, scores the clean and every shifted test
set, and writes ``results.jsonl``, ``report.md`` and PNG plots under ``DIR``.

Correctness (accuracy, ECE, the claims) is the library's rule everywhere: the
first arg-max index equals the label. Methods ``acls_released`` and
``au_pxtau_released`` train with the authors' released arithmetic
(``variant='released_code'``); the claims that come from a published number
use them, and every claim states the smallest difference its seeds could
detect (2 x the paired SEM).
"""

from calib_jax.benchmark.aggregation import aggregate
from calib_jax.benchmark.grid import CALIBRATORS, METHODS
from calib_jax.benchmark.paper_claims import claims
from calib_jax.benchmark.report import write_report
from calib_jax.benchmark.runner import run

__all__ = ["CALIBRATORS", "METHODS", "aggregate", "claims", "run", "write_report"]
