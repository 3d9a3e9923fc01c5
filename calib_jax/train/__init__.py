"""Config-driven, data-parallel training (see ``python -m calib_jax.train --help``)."""

from calib_jax.train.loop import load_jsonl, train_and_evaluate

__all__ = ["train_and_evaluate", "load_jsonl"]
