"""Config-driven, data-parallel training (see ``python -m calib_jax.train --help``).

:func:`validate` checks a training config completely before anything is
computed or written; :func:`train_and_evaluate` runs it.
"""

from calib_jax.train.loop import train_and_evaluate
from calib_jax.train.metrics_log import load_jsonl
from calib_jax.train.validation import validate

__all__ = ["train_and_evaluate", "load_jsonl", "validate"]
