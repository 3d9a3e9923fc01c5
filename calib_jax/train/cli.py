"""Shared pieces of the command-line entry points (train, benchmark).

Both load an ml_collections config file with ``--config`` and turn every user
error into one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys

from absl import flags


def fail(message: str, status: int = 2, *, at_once: bool = False) -> None:
    """Prints a one-line error and exits with ``status`` (2: a user error).

    A message that carries a traceback (a config file that raised) is cut to its
    last line, which names the actual problem; other multi-line messages are
    joined into one line. ``at_once`` ends the process without waiting for
    its other threads (writes to a storage that stalled may never return).
    """
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if any(ln.startswith("Traceback") for ln in lines):
        line = f"{lines[0].split(':', 1)[0]}: {lines[-1]}"
    else:
        line = " ".join(lines) or "unknown error"
    print(f"error: {line}", file=sys.stderr)
    if at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


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
    except ImportError as e:  # the config file (loaded to apply overrides) failed
        hint = (
            " (run from the repository root or put it on PYTHONPATH)"
            if getattr(e, "name", "") == "configs"
            else ""
        )
        fail(f"could not load --config: {type(e).__name__}: {e}{hint}")
    except Exception as e:  # noqa: BLE001 - any other error of the config file
        fail(f"could not load --config: {type(e).__name__}: {e}")
    return []
