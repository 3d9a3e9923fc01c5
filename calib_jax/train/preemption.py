"""Preemption of a training run: SIGTERM and SIGINT become a stop request
that the loop checks between steps, so that it saves a checkpoint first."""

from __future__ import annotations

import signal

import jax
from jax.experimental import multihost_utils

from calib_jax import _cli


class Interrupted(_cli.Stopped):
    """SIGINT (Ctrl-C) stopped the run after saving a checkpoint (exit
    status 130); one-line message."""


class Preemption:
    """Turns SIGTERM and SIGINT into a stop request the loop checks between steps.

    Single process: a Python handler of both signals sets a flag (a second
    SIGINT raises ``KeyboardInterrupt`` at once). Multi-process: JAX's
    preemption service (on by default after ``jax.distributed.initialize``)
    already catches SIGTERM on any host and agrees with every process on one
    step to stop at; :meth:`stop_after` asks it, so all processes save the
    same step together (SIGINT keeps its default there).
    """

    def __init__(self):
        self.requested = False
        self.signal = None  # the signal that asked to stop (single process)
        self._previous = {}
        self._sync = jax.process_count() > 1 and bool(
            jax.config.jax_enable_preemption_service
        )

    def __enter__(self):
        if self._sync:
            return self
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: no signal handling
                break
        return self

    def _handle(self, signum, frame):
        del frame
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop without saving
        self.requested = True
        self.signal = signal.Signals(signum)

    def stop_after(self, step: int) -> bool:
        """Whether to checkpoint and stop after ``step`` (call at every step)."""
        if self._sync:
            return multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
