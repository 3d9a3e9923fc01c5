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

import importlib

from calib_jax.benchmark.grid import CALIBRATORS, METHODS

# The runner and the report import JAX and the trainer; they load at first use,
# so that a benchmark config (which imports the grid's names) stays light.
_LAZY = {
    "aggregate": "calib_jax.benchmark.aggregation",
    "claims": "calib_jax.benchmark.paper_claims",
    "write_report": "calib_jax.benchmark.report",
    "run": "calib_jax.benchmark.runner",
}

__all__ = ["CALIBRATORS", "METHODS", "aggregate", "claims", "run", "write_report"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
