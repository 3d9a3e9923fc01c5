"""Command line: ``python -m calib_jax.train --config configs/<file>.py[:arg] --workdir DIR``.

User errors (a config typo, an unknown name, a bad workdir) end the run with one
line on stderr and exit code 2, before any compute starts.
"""

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
flags.mark_flags_as_required(["config", "workdir"])


def fail(message: str) -> None:
    """Prints a one-line error and exits with status 2.

    A message that carries a traceback (a config file that raised) is cut to its
    last line, which names the actual problem; other multi-line messages are
    joined into one line.
    """
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if any(ln.startswith("Traceback") for ln in lines):
        line = f"{lines[0].split(':', 1)[0]}: {lines[-1]}"
    else:
        line = " ".join(lines) or "unknown error"
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with config errors (typos, bad values) as one line."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(f"{e}")
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # config_flags raises these for a misspelt or ill-typed --config.x=y;
        # their text is a repr with escaped quotes and newlines.
        text = str(e).encode("utf-8").decode("unicode_escape").replace("'", "")
        fail(f"bad --config override: {text}")
    return []


def main(argv):
    del argv
    from calib_jax.train.loop import train_and_evaluate  # after flag parsing

    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        config = _CONFIG.value
        config.keys()  # a file that failed to load raises on first access
    except Exception as e:  # noqa: BLE001 - config files are loaded lazily here
        fail(f"could not load --config: {e}")
    try:
        summary = train_and_evaluate(config, _WORKDIR.value)
    except ValueError as e:
        fail(str(e))
    shown = sorted(
        k for k in summary if k.count("/") == 1 or k.startswith("shift/mean/")
    )
    for key in shown:
        print(f"{key:28s} {summary[key]:.4f}")


def run():
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
