"""One mapping from exceptions to exit statuses for every command.

``python -m calib_jax.train``, ``calib_jax.evaluate``, ``calib_jax.benchmark``
and ``calib_jax.posthoc`` run their work through :func:`run_main`, which turns
what went wrong into one line on stderr and an exit status:

======  ==================================================================
status  cause
======  ==================================================================
0       done, or a run stopped by SIGTERM after saving (:class:`Stopped`)
2       a user error: :class:`UserError` or ``ValueError`` (``error: ...``)
3       a run that diverged: ``FloatingPointError`` (``error: ...``)
4       storage that failed while an output was written
        (:class:`StorageWriteError`; ``error: ...``); rerunning resumes
130     Ctrl-C: ``KeyboardInterrupt``, or a :class:`Stopped` whose
        status is 130 (a checkpoint was saved)
======  ==================================================================

:func:`finish` then ends the process; after status 4 or 130 it does not wait
for the other threads (a stalled write may never return, an input prefetch
or a checkpoint write may be cut short).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_STORAGE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class UserError(Exception):
    """An error in the command line or the input files (exit status 2)."""


class StorageWriteError(OSError):
    """Storage failed while an output was written (exit status 4); its
    message is one line."""


class Stopped(Exception):  # noqa: N818 - a requested stop, not an error
    """A run stopped by a signal after saving; its message (one line) says
    what was saved, :attr:`status` is the exit status."""

    status = EXIT_INTERRUPTED


def one_line(message) -> str:
    """``message`` as one line: a text that carries a traceback (a config file
    that raised) is cut to its first and last lines, which name the actual
    problem; other lines are joined."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if any(ln.startswith("Traceback") for ln in lines):
        return f"{lines[0].split(':', 1)[0]}: {lines[-1]}"
    return " ".join(lines) or "unknown error"


def finish(status: int) -> None:
    """Ends the process with ``status``; after 4 or 130 without waiting for
    its other threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status in (EXIT_STORAGE, EXIT_INTERRUPTED):
        os._exit(status)
    sys.exit(status)


def fail(message, status: int = EXIT_USAGE) -> None:
    """Prints ``error: <message as one line>`` and ends the process."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    finish(status)


def run_main(
    body: Callable[[], int | None], *, interrupted: str = "interrupted"
) -> int:
    """Runs ``body`` and returns its exit status (None counts as 0), or the
    status of the exception it raised after printing its one line.

    Args:
      body: the command's work.
      interrupted: the line printed for Ctrl-C outside a saving stop.
    """
    try:
        return body() or 0
    except Stopped as err:
        print(str(err), file=sys.stderr)
        return err.status
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UserError, ValueError, FloatingPointError, StorageWriteError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        if isinstance(err, FloatingPointError):
            return EXIT_DIVERGED
        return EXIT_STORAGE if isinstance(err, StorageWriteError) else EXIT_USAGE
