"""TensorBoard event files beside ``metrics.jsonl``, written without TensorFlow.

``--config.log.tensorboard=True`` makes the trainer, ``python -m
calib_jax.evaluate`` and the benchmark also write their scalars (training
losses per logged step, every evaluation metric, per-shift metrics included)
and reliability diagrams (as images) to event files that TensorBoard reads:
``tensorboard --logdir <workdir>``. The records are built with ``tensorboardX``'s
protos and framing, the same records as TensorFlow's writer, without importing
it. They are written on the calling thread (no writer thread or queue): a run
writes a few records per logged step, and a background writer would add
threads to every process that logs.

Only process 0 writes. The directory is checked for writing before any
compute (:func:`check_writable`), so a bad directory fails in one line
instead of after hours of training.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections.abc import Mapping
from typing import Self

import jax
import numpy as np
from etils import epath
from ml_collections import ConfigDict

from calib_jax import plots, storage

DIRNAME = "tensorboard"

# Seconds between flushes of a local event file to disk while writing (as
# TensorFlow's writer does by default every 120 s; shorter, for live curves).
FLUSH_SECS = 30.0


class _EventFile:
    """One event file, written synchronously: ``events.out.tfevents.*``."""

    def __init__(self, logdir: str, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        os.makedirs(logdir, exist_ok=True)
        # The file name carries the time and host, and a unique suffix so that
        # two writers opened in the same second never share a file.
        self._file = EventsWriter(
            os.path.join(logdir, "events"), f".{uuid.uuid4().hex[:8]}"
        )
        self._event = Event
        self._flushed = time.monotonic()
        if purge_step is not None:
            # TensorBoard drops earlier files' events at steps >= purge_step.
            self._file.write_event(
                Event(
                    step=purge_step,
                    wall_time=time.time(),
                    session_log=SessionLog(status=SessionLog.START),
                )
            )

    def add_summary(self, summary, step: int) -> None:
        """Appends ``summary`` as an event at ``step``."""
        self._file.write_event(
            self._event(wall_time=time.time(), step=int(step), summary=summary)
        )
        if time.monotonic() - self._flushed >= FLUSH_SECS:
            self.flush()

    def flush(self) -> None:
        """Writes the buffered records to disk."""
        self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        """Flushes and closes the file."""
        self._file.close()


def tag(name: str) -> str:
    """The TensorBoard tag of a metric name: characters other than letters,
    digits, ``_ - . /`` become ``_`` (``ts:nll/test/ece`` -> ``ts_nll/test/ece``),
    as TensorBoard's tag rules ask."""
    return re.sub(r"[^-/\w.]", "_", name)


def enabled(config: ConfigDict) -> bool:
    """Whether ``config.log.tensorboard`` asks for event files (False if absent)."""
    log = config.get("log")
    return bool(log is not None and log.get("tensorboard", False))


def log_dir(
    config: ConfigDict, workdir: epath.PathLike, *, subdir: str = ""
) -> epath.Path:
    """``<workdir>/tensorboard``, or ``config.log.tensorboard_dir/<subdir>`` if set."""
    log = config.get("log")
    custom = log.get("tensorboard_dir", "") if log is not None else ""
    if not custom:
        return epath.Path(workdir) / DIRNAME
    path = storage.as_path(custom, what="config.log.tensorboard_dir")
    return path / subdir if subdir else path


def check_writable(directory: epath.PathLike) -> None:
    """Checks that ``directory`` can be created and written, leaving no trace.

    Creates it (and its parents), writes and removes a probe file, and removes
    again every local directory it created (in an object store a directory is
    only a name prefix), so a run rejected later leaves its workdir as it was.

    Raises:
      ValueError: the directory cannot be created or written (one line).
    """
    directory = storage.as_path(directory, what="TensorBoard log directory")
    if jax.process_index() != 0:
        return
    probe = directory / f".write_check_{uuid.uuid4().hex}"
    try:
        created = [] if storage.is_remote(directory) else _missing(directory)
        storage.make_dirs(directory)
        storage.write_bytes(probe, b"")
        probe.unlink()
        for path in created:  # innermost first; the writer creates them again
            path.rmdir()
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(
            f"TensorBoard log directory {directory} is not writable "
            f"(--config.log.tensorboard=True): {type(e).__name__}: {reason}"
        ) from None


def _missing(directory: epath.Path) -> list[epath.Path]:
    """``directory`` and its ancestors that do not exist yet, innermost first."""
    missing = []
    path = directory
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def figure_image(fig) -> np.ndarray:
    """The RGB pixels ``uint8 [H, W, 3]`` of a matplotlib figure (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else None
    canvas = canvas or FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


class Writer:
    """Scalars and images to one TensorBoard run directory (process 0 only).

    The event file is opened at the first write, so a writer that never
    writes leaves no file. Use as a context manager or call :meth:`close`.
    In an object store (``gs://``) the events are written to a local
    temporary file and uploaded whole through :mod:`calib_jax.storage` at
    most every ``upload_secs`` seconds of writing and at :meth:`flush` and
    :meth:`close`, as ``metrics.jsonl`` is.

    Args:
      directory: the run's log directory (local or ``gs://``).
      upload_secs: seconds between uploads to an object store.
    """

    def __init__(self, directory: epath.PathLike, *, upload_secs: float = 60.0):
        self.directory = storage.as_path(directory, what="TensorBoard log directory")
        self.upload_secs = upload_secs
        self.purge_step = None
        self._writer = None
        self._local = None  # the temporary directory of a remote log dir
        self._uploaded = 0.0

    def _open(self):
        if self._writer is None:
            target = self.directory
            if storage.is_remote(self.directory):
                self._local = tempfile.TemporaryDirectory(prefix="calib_jax_tb_")
                target = self._local.name
                self._uploaded = time.monotonic()
            self._writer = _EventFile(os.fspath(target), self.purge_step)
        return self._writer

    def resume_at(self, step: int) -> None:
        """Marks a run resumed from ``step``: TensorBoard drops the events of
        earlier files at steps >= ``step`` (those of the interrupted run past
        its last checkpoint, which the resumed run writes again)."""
        if self._writer is not None:
            raise RuntimeError("resume_at must be called before the first write.")
        self.purge_step = int(step)

    def _copy_up(self) -> None:
        """Copies the local event files of a remote log dir to it (whole)."""
        for path in sorted(epath.Path(self._local.name).iterdir()):
            storage.write_bytes(self.directory / path.name, path.read_bytes())
        self._uploaded = time.monotonic()

    def _wrote(self) -> None:
        due = time.monotonic() - self._uploaded >= self.upload_secs
        if self._local is not None and due:
            self._writer.flush()
            self._copy_up()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Writes each ``values[name]`` as a scalar at ``step``.

        The tags are the names (the JSONL keys) through :func:`tag`.
        """
        if jax.process_index() != 0 or not values:
            return
        from tensorboardX import summary  # no TensorFlow import

        writer = self._open()
        for name, value in values.items():
            writer.add_summary(summary.scalar(tag(name), float(value)), step)
        self._wrote()

    def image(self, tag: str, step: int, fig) -> None:
        """Writes a matplotlib figure as an image at ``step``."""
        self.add_image(tag, step, figure_image(fig))

    def add_image(self, tag: str, step: int, pixels: np.ndarray) -> None:
        """Writes RGB pixels ``uint8 [H, W, 3]`` as an image at ``step``."""
        if jax.process_index() != 0:
            return
        from tensorboardX import summary  # no TensorFlow import

        image = summary.image(tag, np.asarray(pixels), dataformats="HWC")
        self._open().add_summary(image, step)
        self._wrote()

    def reliability(self, tag: str, step: int, logits, labels, **kwargs) -> None:
        """Writes the reliability diagram of ``logits`` as an image at ``step``.

        ``kwargs`` go to :func:`calib_jax.plots.reliability_diagram`.
        """
        if jax.process_index() != 0:
            return
        probs = jax.nn.softmax(np.asarray(logits, np.float32), axis=-1)
        fig = plots.reliability_diagram(probs, np.asarray(labels), **kwargs)
        self.image(tag, step, fig)

    def flush(self) -> None:
        """Writes buffered events to the file (and uploads a remote one)."""
        if self._writer is not None:
            self._writer.flush()
            if self._local is not None:
                self._copy_up()

    def close(self) -> None:
        """Flushes and closes the event file (and uploads a remote one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if self._local is not None:
                self._copy_up()
                self._local.cleanup()
                self._local = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoWriter:
    """The :class:`Writer` interface that writes nothing (TensorBoard off)."""

    def scalars(self, step, values) -> None:
        """Does nothing."""

    def image(self, tag, step, fig) -> None:
        """Does nothing."""

    def add_image(self, tag, step, pixels) -> None:
        """Does nothing."""

    def reliability(self, tag, step, logits, labels, **kwargs) -> None:
        """Does nothing."""

    def resume_at(self, step) -> None:
        """Does nothing."""

    def flush(self) -> None:
        """Does nothing."""

    def close(self) -> None:
        """Does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        pass


def from_config(
    config: ConfigDict, workdir: epath.PathLike, *, subdir: str = ""
) -> Writer | NoWriter:
    """A checked :class:`Writer` when ``config.log.tensorboard``, else a no-op.

    The directory is :func:`log_dir`'s (``subdir`` of a custom directory
    keeps, e.g., an evaluation apart from its training run).

    Raises:
      ValueError: the log directory is not writable (one line).
    """
    if not enabled(config):
        return NoWriter()
    directory = log_dir(config, workdir, subdir=subdir)
    check_writable(directory)
    return Writer(directory)
