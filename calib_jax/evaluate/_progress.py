"""Progress over the evaluation sets: a bar on a terminal, one line per interval otherwise."""

from __future__ import annotations

import sys
import time
from typing import Self, TextIO


class Progress:
    """Counts evaluated images and shows rate and ETA.

    On a terminal it is a ``tqdm`` bar; on anything else (a log file, a CI
    console) it writes one plain line every ``interval`` seconds and one at
    the end, e.g. ``evaluate: 1200/5000 images (24%), shift/contrast/3,
    850 img/s, ETA 4 s``.

    Args:
      total: images to evaluate (every set).
      enabled: False shows nothing (other processes than 0).
      stream: where to write (default ``sys.stderr``).
      interval: seconds between plain lines.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 10.0,
    ):
        self.total, self.enabled, self.interval = int(total), enabled, interval
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.key = 0, ""
        self.start = self.last = time.perf_counter()
        self.bar = None
        isatty = getattr(self.stream, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                desc="evaluate",
                unit="img",
                file=self.stream,
                dynamic_ncols=True,
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
            f"evaluate: {self.done}/{self.total} images ({pct:.0f}%), {self.key}, "
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
