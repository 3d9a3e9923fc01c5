"""Progress bars with rate and ETA for every long wait, on a terminal or in a log.

On a terminal :func:`bar` is a ``tqdm`` bar redrawn in place; bars of inner
work (the training steps of a benchmark cell, its evaluation, its post-hoc
fits) sit on the line under their outer bar (``level=1``) and vanish when
done. Anywhere else (a batch log, a CI console, a pipe) a bar writes one
plain line per ``interval`` seconds and one when it ends, never a carriage
return, e.g. ``train mlp/digits:  40%|####      | 400/1000 [00:10<00:15,
40.0step/s]``.

The environment variable ``CALIB_JAX_PROGRESS`` turns every bar off (``0``)
or leaves them to their callers (``1``, ``auto`` or unset): the test suite
sets ``0``, so that no verdict on a command's output depends on how long its
work took.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Self, TextIO

# Seconds between the lines of a bar outside a terminal.
LOG_INTERVAL = 10.0
# The environment variable that turns every bar off ("0").
ENV = "CALIB_JAX_PROGRESS"
_SHOWN = {"0": False, "1": True, "auto": True, "": True}
# ANSI control sequences (tqdm moves the cursor to draw nested bars).
_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The drawn bar between a line's share and its count ("|####      |").
_BAR = re.compile(r"\|[^|]*\|")


class LineStream:
    """A stream for ``tqdm`` that writes each refresh as a line of its own.

    Carriage returns and terminal control sequences (cursor moves) are
    dropped, so a log file holds one readable line per refresh instead of one
    overwritten line; a line that repeats the previous one's count (a bar
    closed right after its last update) is skipped.

    Args:
      stream: where the lines go.
    """

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._last = None

    def write(self, text: str) -> int:
        """Writes ``text`` without carriage returns, as one line if not blank."""
        line = _CONTROL.sub("", text).replace("\r", "").strip()
        # Description, share and n/total, without the bar: the bar's width
        # follows the length of the rate text, which depends on timing.
        count = _BAR.sub("|", line.split(" [", 1)[0])
        if line and count != self._last:
            self._last = count
            self._stream.write(line + "\n")
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        """Flushes the underlying stream."""
        self._stream.flush()


def shown() -> bool:
    """Whether bars may show, by ``CALIB_JAX_PROGRESS`` (``0``, ``1`` or ``auto``).

    ``0`` turns every bar off; ``1``, ``auto`` or unset leave each bar to its
    caller's ``enabled``. Read when a bar is made.

    Raises:
      ValueError: the variable holds another value.
    """
    value = os.environ.get(ENV, "auto")
    if value.strip().lower() not in _SHOWN:
        raise ValueError(f"{ENV} must be 0, 1 or auto, got {value!r}")
    return _SHOWN[value.strip().lower()]


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def bar(
    total: int | None,
    *,
    desc: str,
    unit: str,
    initial: int = 0,
    enabled: bool = True,
    level: int = 0,
    stream: TextIO | None = None,
    interval: float | None = None,
    delay: float = 0.0,
):
    """A ``tqdm`` bar with rate and ETA: redrawn on a terminal, lines elsewhere.

    Args:
      total: the amount of work (None: unknown, no ETA).
      desc: what is being done (the bar's prefix).
      unit: what is counted (``'step'``, ``'img'``, ``'fit'``).
      initial: work already done (a resumed run).
      enabled: False returns a disabled bar (other processes than 0, or
        progress turned off); it accepts every call and shows nothing. So
        does ``CALIB_JAX_PROGRESS=0`` (see :func:`shown`).
      level: 0 for an outermost bar; 1 for a bar of inner work, drawn under
        its outer bar on a terminal and removed when it closes.
      stream: where to write (default ``sys.stderr``).
      interval: seconds between lines outside a terminal (default
        :data:`LOG_INTERVAL`).
      delay: show nothing until the work has taken this many seconds.

    Returns:
      A ``tqdm.tqdm`` instance (``update``, ``set_postfix_str``, ``write``,
      ``close``; a context manager).
    """
    from tqdm import tqdm

    stream = stream if stream is not None else sys.stderr
    interval = LOG_INTERVAL if interval is None else interval
    common = {
        "total": total,
        "desc": desc,
        "unit": unit,
        "initial": initial,
        "disable": not (enabled and shown()),
        "delay": delay,
    }
    if is_terminal(stream):
        return tqdm(
            **common,
            file=stream,
            dynamic_ncols=True,
            position=level,
            leave=level == 0,
        )
    return tqdm(
        **common,
        file=LineStream(stream),
        position=0,  # one line each, no cursor moves between nested bars
        ascii=True,
        ncols=100,
        mininterval=interval,
        miniters=1,
    )


class Progress:
    """Counts evaluated images and shows rate and ETA.

    On a terminal it is a ``tqdm`` bar; on anything else (a log file, a CI
    console) it writes one plain line every ``interval`` seconds and one at
    the end, e.g. ``evaluate: 1200/5000 images (24%), shift/contrast/3,
    850 img/s, ETA 4 s``.

    Args:
      total: images to evaluate (every set).
      enabled: False shows nothing (other processes than 0); so does
        ``CALIB_JAX_PROGRESS=0`` (see :func:`shown`).
      stream: where to write (default ``sys.stderr``).
      interval: seconds between plain lines.
      desc: the prefix of the bar and of each line.
      level: 0 for an outermost bar; 1 under an outer bar (a benchmark
        cell's), removed from the terminal when it closes.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 10.0,
        desc: str = "evaluate",
        level: int = 0,
    ):
        self.total, self.interval = int(total), interval
        self.enabled = enabled and shown()
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.key = 0, ""
        self.start = self.last = time.perf_counter()
        self.bar = None
        if self.enabled and is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                desc=desc,
                unit="img",
                file=self.stream,
                dynamic_ncols=True,
                position=level,
                leave=level == 0,
            )

    def __call__(self, key: str, images: int) -> None:
        """Records ``images`` more images of set ``key``."""
        if not self.enabled:
            return
        self.done += images
        self.key = key
        if self.bar is not None:
            self.bar.set_postfix_str(key, refresh=False)
            self.bar.update(images)
            return
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.done / max(self.total, 1)
        print(
            f"{self.desc}: {self.done}/{self.total} images ({pct:.0f}%), {self.key}, "
            f"{rate:.0f} img/s, ETA {left:.0f} s",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        """Ends the bar, or writes the final line."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            self._line(time.perf_counter())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
