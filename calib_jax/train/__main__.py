"""Command line: ``python -m calib_jax.train --config configs/<file>.py[:arg] --workdir DIR``."""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file (optionally ':arg').", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics and logits."
)


def main(argv):
    del argv
    from calib_jax.train.loop import train_and_evaluate  # after flag parsing

    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for key in sorted(
        k for k in summary if k.count("/") == 1 or k.startswith("shift/mean/")
    ):
        print(f"{key:28s} {summary[key]:.4f}")


def run():
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)


if __name__ == "__main__":
    run()
