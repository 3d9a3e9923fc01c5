"""Shared pieces of the command-line entry points (train, evaluate, benchmark).

All three load an ml_collections config file with ``--config`` and turn every
user error into one line on stderr and exit status 2. ``--config`` takes a
path or the name of a config shipped in the package (``calib_jax.configs``,
the repository's ``configs/`` directory), so the commands work from any
directory after ``pip install``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import flags
from etils import epath

# Modules of the configs directory that are not configs.
_NOT_CONFIGS = ("__init__", "common")


def shipped_configs() -> dict[str, epath.Path]:
    """The config files shipped in the package, ``{name: path}`` (name without ``.py``)."""
    root = epath.resource_path("calib_jax.configs")
    return {
        p.name[:-3]: p
        for p in sorted(root.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".py") and p.name[:-3] not in _NOT_CONFIGS
    }


def resolve_config(value: str) -> str:
    """Turns a ``--config`` value into the path of a config file (``:arg`` kept).

    An existing file is used as given. Otherwise a bare name (``digits_ce``,
    ``digits_ce.py``) or a ``configs/<name>.py`` path (the README's commands,
    run outside the repository) names the shipped config of that name.

    Raises:
      ValueError: neither a file nor a shipped config; the message lists the
        shipped configs.
    """
    path, sep, arg = value.partition(":")
    if epath.Path(path).is_file():
        return value
    parent, _, name = path.rpartition("/")
    name = name.removesuffix(".py")
    shipped = shipped_configs()
    if parent.rstrip("/").rpartition("/")[2] in ("", "configs") and name in shipped:
        return f"{shipped[name]}{sep}{arg}"
    raise ValueError(
        f"unknown --config '{path}': no such file and no shipped config of that "
        f"name; shipped configs: {', '.join(shipped)}."
    )


def _with_resolved_config(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of ``--config`` (not ``--config.x=y``) resolved."""
    out = list(argv)
    i = 1
    while i < len(out):
        token = out[i]
        if token == "--":
            break
        flag, eq, value = token.partition("=")
        if flag in ("--config", "-config"):
            if eq:
                out[i] = f"{flag}={resolve_config(value)}"
            elif i + 1 < len(out):
                out[i + 1] = resolve_config(out[i + 1])
                i += 1
        i += 1
    return out


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
    """absl flag parsing with config errors (typos, bad values) as one line.

    ``--config`` is first resolved by :func:`resolve_config` (a path, or the
    name of a shipped config).
    """
    try:
        argv = _with_resolved_config(argv)
    except ValueError as e:
        fail(str(e))
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
        fail(f"could not load --config: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - any other error of the config file
        fail(f"could not load --config: {type(e).__name__}: {e}")
    return []
