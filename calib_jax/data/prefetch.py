"""Background prefetch: an iterator's next items, produced on a thread.

The trainer wraps ``map(run.batch, steps)``, where ``run.batch(step)`` gathers
the host batch of ``step`` and places it on the mesh with the step's
``NamedSharding`` (``jax.make_array_from_process_local_data``). With
``depth = config.input.prefetch`` the gather and the host-to-device copy of the
next batches overlap the device's work on the current one. Each batch is still
the pure function of ``(seed, step)`` that the synchronous path computes, in
the same order, so training with and without prefetch is the same bit for bit.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

_log = logging.getLogger(__name__)
T = TypeVar("T")

_POLL_S = 0.05  # how often a blocked producer looks for a stop request
_JOIN_S = 60.0


class Prefetcher(Iterator[T], Generic[T]):
    """Iterates over ``items``, producing up to ``depth`` items ahead on a thread.

    ``depth = 0`` produces each item in ``__next__`` on the calling thread (no
    thread). Otherwise a daemon thread runs ``items``; at most ``depth`` items
    exist beyond those already returned (made or being made), so a producer of
    device arrays holds at most ``depth`` batches in device memory. An exception
    raised by ``items`` is re-raised by the ``__next__`` that reaches it, with
    its traceback. :meth:`close` (also on leaving a ``with`` block, on any
    exception or early return) stops the thread and waits for it.

    The time ``__next__`` spends blocked is measured: :meth:`wait_fraction`
    gives its share of the wall time since the previous call.

    Args:
      items: any iterable; with ``depth > 0`` it is iterated on the thread.
      depth: items made ahead (>= 0).
    """

    def __init__(self, items: Iterable[T], depth: int):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"prefetch depth must be an int >= 0, got {depth!r}.")
        self.depth = depth
        self._items = iter(items)
        self._done = False
        self._waited = 0.0
        self._since = time.perf_counter()
        self._thread: threading.Thread | None = None
        if depth:
            self._ready: collections.deque = collections.deque()
            self._cond = threading.Condition()
            self._slots = threading.Semaphore(depth)
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._produce, name="calib_jax-prefetch", daemon=True
            )
            self._thread.start()

    # ---- producer thread -------------------------------------------------------------

    def _acquire_slot(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=_POLL_S):
                return True
        return False

    def _push(self, kind: str, value) -> None:
        with self._cond:
            self._ready.append((kind, value))
            self._cond.notify()

    def _produce(self) -> None:
        try:
            while self._acquire_slot():
                try:
                    item = next(self._items)
                except StopIteration:
                    self._push("end", None)
                    return
                self._push("item", item)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._push("error", e)
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:  # a generator stopped early: run its finally
                close()

    # ---- consumer ----------------------------------------------------------------------

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        try:
            if self._thread is None:
                try:
                    return next(self._items)
                except StopIteration:
                    self._done = True
                    raise
            with self._cond:
                while not self._ready:
                    self._cond.wait()
                kind, value = self._ready.popleft()
            if kind == "item":
                self._slots.release()
                return value
            self._done = True
            self.close()
            if kind == "error":
                raise value
            raise StopIteration
        finally:
            self._waited += time.perf_counter() - start

    def wait_fraction(self) -> float:
        """Share of the wall time since the last call (or creation) spent in ``next``.

        Returns a float in ``[0, 1]`` and starts a new interval.
        """
        now = time.perf_counter()
        elapsed = now - self._since
        fraction = self._waited / elapsed if elapsed > 0 else 0.0
        self._waited, self._since = 0.0, now
        return min(max(fraction, 0.0), 1.0)

    def close(self) -> None:
        """Stops the producer thread and waits for it (idempotent)."""
        self._done = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(_JOIN_S)
        if thread.is_alive():  # an item that takes minutes to make
            _log.warning("The prefetch thread did not stop within %.0f s.", _JOIN_S)
        self._ready.clear()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
