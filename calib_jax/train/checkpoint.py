"""A thin wrapper over Orbax's CheckpointManager: save, and resume from the latest good one."""

from __future__ import annotations

import logging
import sys

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from calib_jax import _cli, storage
from calib_jax.train import checksums
from calib_jax.train.state import TrainState

# The checkpoint item that holds the state's checksums (calib_jax.train.checksums).
CHECKSUMS = "checksums"


class DamagedCheckpoint(Exception):
    """A checkpoint whose bytes do not restore, or restore other numbers."""


class CheckpointSaveError(_cli.StorageWriteError):
    """Storage failed while a checkpoint was written; its message is one line."""


class _NoOrbaxSaveErrors(logging.Filter):
    """Drops Orbax's own error logs (a traceback each) of a failed save.

    The failure is raised again, as one :class:`CheckpointSaveError`, by the
    next call of the manager (save, wait or close), which is what reports it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno >= logging.ERROR
            and "orbax" in record.pathname
            and record.exc_info is not None
        )


def _reason(e: BaseException) -> str:
    """One short line for why a checkpoint did not restore."""
    if isinstance(e, DamagedCheckpoint):
        return str(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    # tensorstore appends a repr of the whole store spec to its errors.
    first = first.split(" See full TensorStore details")[0]
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# What the array reads that were still in flight when a damaged checkpoint's
# restore failed report later, from tensorstore's threads, once per array.
_LATE_READ_ERRORS = ("Event loop is closed", "Encountered error while reading array")


class _NoLateReadErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in str(record.msg)


def _quiet_late_read_errors() -> None:
    """Keeps the echoes of a failed read or write off stderr (one line says it all).

    When Orbax fails to read one array of a damaged checkpoint it stops
    waiting for the others; their reads end later on tensorstore's threads,
    which report them as unraisable exceptions (a traceback each) and through
    asyncio's "exception was never retrieved" log. Installed once a restore
    failed, or a checkpointer is created (writes that fail leave the same);
    other unraisable exceptions still go to the previous hook.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_calib_jax_quiet", False):
        return

    def hook(unraisable):
        text = str(unraisable.exc_value)
        if not any(text.startswith(m) for m in _LATE_READ_ERRORS):
            previous(unraisable)

    hook._calib_jax_quiet = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_NoLateReadErrors())


def _restore_verified(
    manager: ocp.CheckpointManager, step: int, abstract_state: TrainState
) -> TrainState:
    """Restores ``step`` and checks it against the checksums saved with it.

    Raises:
      DamagedCheckpoint: the checksums are missing, or an array differs.
      Exception: whatever Orbax raises for bytes it cannot read.
    """
    if not (manager.directory / str(step) / CHECKSUMS).exists():  # an epath.Path
        raise DamagedCheckpoint("it has no checksum record")
    try:
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                **{CHECKSUMS: ocp.args.JsonRestore()},
            ),
        )
    except Exception:
        _quiet_late_read_errors()
        raise
    why = checksums.mismatch(restored["state"], restored[CHECKSUMS])
    if why is not None:
        raise DamagedCheckpoint(why)
    return restored["state"]


def checkpoint_steps(workdir: str | epath.PathLike) -> list[int]:
    """Steps with a finished checkpoint under ``<workdir>/checkpoints``, newest first.

    Reads the directory only (nothing is created, cleaned up or moved).
    """
    directory = storage.as_path(workdir) / "checkpoints"
    if not directory.is_dir():
        return []
    manager = _read_only_manager(directory)
    try:
        return sorted(manager.all_steps(), reverse=True)
    finally:
        manager.close()


class _NoReadOnlyNotice(logging.Filter):
    """Drops Orbax's warning that a read-only manager's directory is read only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")


def _read_only_manager(directory: epath.Path) -> ocp.CheckpointManager:
    quiet = _NoReadOnlyNotice()
    logger = logging.getLogger("absl")  # Orbax logs through absl
    logger.addFilter(quiet)
    try:
        return ocp.CheckpointManager(
            storage.absolute(directory),
            options=ocp.CheckpointManagerOptions(
                read_only=True,
                create=False,
                cleanup_tmp_directories=False,
                save_interval_steps=0,
            ),
        )
    finally:
        logger.removeFilter(quiet)


def restore_read_only(
    workdir: str | epath.PathLike, abstract_state: TrainState
) -> tuple[TrainState, int]:
    """The newest intact checkpoint of ``workdir``, restored into ``abstract_state``.

    Unlike :meth:`Checkpointer.restore_latest`, the run's directory is never
    changed: a damaged checkpoint (unreadable, or arrays that differ from the
    checksums saved with them) is skipped with a warning, not moved, and
    unfinished saves are left alone (evaluating a run must not alter it).

    Returns:
      ``(state, step)``.

    Raises:
      ValueError: no checkpoint, or none that restores (the first error is
        named: a checkpoint of another model or optimizer than the config's).
    """
    directory = storage.as_path(workdir) / "checkpoints"
    steps = checkpoint_steps(workdir)
    if not steps:
        raise ValueError(f"{directory} holds no finished checkpoint.")
    manager = _read_only_manager(directory)
    errors = []
    try:
        for step in steps:
            try:
                state = _restore_verified(manager, step, abstract_state)
            except Exception as e:  # noqa: BLE001 - any read failure means skip it
                errors.append(f"step {step}: {_reason(e)}")
                logging.warning(
                    "Skipping checkpoint %s that does not restore (%s).",
                    directory / str(step),
                    errors[-1],
                )
                continue
            return state, step
    finally:
        manager.close()
    raise ValueError(
        f"No checkpoint under {directory} restores with this config (is it the "
        f"run's config?); {errors[0]}"
    )


class Checkpointer:
    """Saves ``TrainState`` under ``<workdir>/checkpoints/<step>``.

    Restores always go through an abstract target (shapes, dtypes and
    shardings of a freshly initialised state), so arrays come back with the
    shardings the step expects. Every save records a SHA-256 checksum of each
    array (:mod:`calib_jax.train.checksums`) in the same checkpoint. A
    checkpoint that cannot be read (truncated, missing or garbled files) or
    whose arrays differ from their checksums (a flipped byte) is never
    restored: the previous one is tried, and once an intact one is found the
    damaged newer ones are moved (not deleted) to
    ``<workdir>/checkpoints_unreadable/<step>``, with one warning line each,
    so that training saves those steps again when it reaches them.

    A save cut short (SIGKILL) is never a checkpoint: Orbax deletes its
    leftovers when the next run creates the manager.

    ``workdir`` may be a ``gs://`` URL: Orbax then writes the array data
    through tensorstore and marks a finished step with ``commit_success.txt``
    (an object store has no atomic rename); unreadable steps are moved aside
    by copying their objects, then deleting them.

    Storage that fails or stalls (``save_timeout_s``) during a save makes the
    next :meth:`save`, :meth:`wait` or :meth:`close` raise
    :class:`CheckpointSaveError`, one line naming the step's path.
    """

    def __init__(
        self,
        workdir: str | epath.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_timeout_s: int = 1200,
    ):
        self.directory = storage.absolute(workdir) / "checkpoints"
        self._saving = None  # the step of the save in flight, if any
        self._quiet = _NoOrbaxSaveErrors()
        logging.getLogger("absl").addFilter(self._quiet)  # Orbax logs through absl
        # A failed write reports its in-flight siblings as soon as it fails.
        _quiet_late_read_errors()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                # A save cut short leaves an unfinished step: a temporary
                # directory locally; in a bucket, a step directory without
                # commit_success.txt, into which the next save of that step
                # would write. Orbax deletes them here.
                cleanup_tmp_directories=True,
                # A save whose writes do not finish in time (stalled storage)
                # fails, and the next save or wait reports it.
                async_options=ocp.AsyncOptions(timeout_secs=int(save_timeout_s)),
            ),
        )

    def _failed(self, step: int | None, e: BaseException) -> CheckpointSaveError:
        _quiet_late_read_errors()  # writes still in flight report late, too
        where = self.directory / str(step) if step is not None else self.directory
        return CheckpointSaveError(
            f"saving checkpoint {where} failed ({_reason(e)}); the run stopped. "
            "Rerun the same command to resume from the last complete checkpoint."
        )

    def save(self, state: TrainState, *, force: bool = False) -> None:
        """Starts saving ``state`` as its step (done in the background).

        Raises:
          CheckpointSaveError: this save, or the previous one still in
            flight, failed to write (one line naming the step's path).
        """
        step = int(jax.device_get(state.step))
        self.wait()  # the previous save's failure is named as its own
        if step in self.manager.all_steps():
            return
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            **{CHECKSUMS: ocp.args.JsonSave(checksums.digest(state))},
        )
        self._saving = step
        try:
            self.manager.save(step, args=args, force=force)
        except Exception as e:  # noqa: BLE001 - any storage error stops the run
            raise self._failed(step, e) from e

    def restore_latest(self, abstract_state: TrainState) -> TrainState | None:
        """The newest intact checkpoint, or None when there is none.

        A damaged newer step (it does not read, or its arrays differ from the
        checksums saved with them) is set aside, with one warning line each.
        """
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                state = _restore_verified(self.manager, step, abstract_state)
            except Exception as e:  # noqa: BLE001 - any read failure means skip it
                damaged.append((step, _reason(e)))
                continue
            self._set_aside(damaged, step)
            return state
        self._set_aside(damaged, None)
        return None

    def _set_aside(self, damaged: list[tuple[int, str]], resume: int | None) -> None:
        """Moves damaged step directories out of the manager's way."""
        if not damaged:
            return
        then = f"resuming from step {resume}" if resume is not None else "starting over"
        if jax.process_index() == 0:
            aside = self.directory.parent / "checkpoints_unreadable"
            storage.make_dirs(aside)
            for step, why in damaged:
                target = aside / str(step)
                n = 1
                while target.exists():  # the same step went bad before
                    target, n = aside / f"{step}.{n}", n + 1
                storage.move_tree(self.directory / str(step), target)
                logging.warning(
                    "Checkpoint %s is damaged (%s); moved it to %s, %s.",
                    self.directory / str(step),
                    why,
                    target,
                    then,
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("calib_jax_checkpoint_set_aside")
        self.manager.reload()

    def wait(self) -> None:
        """Waits for the save in flight; CheckpointSaveError if it failed."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - any storage error stops the run
            raise self._failed(self._saving, e) from e
        self._saving = None

    def close(self) -> None:
        """Waits for the save in flight, then releases the manager.

        Raises:
          CheckpointSaveError: the save in flight failed (the manager is
            released all the same).
        """
        try:
            self.wait()
        except CheckpointSaveError:
            self.abandon()
            raise
        self.manager.close()
        logging.getLogger("absl").removeFilter(self._quiet)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Closes after a finished run, a divergence or a stop that saved
        (:class:`calib_jax._cli.Stopped`; :meth:`close` raises a save that
        failed); abandons after a storage failure or another error; leaves
        the manager to the ending process after ``KeyboardInterrupt`` (a
        second Ctrl-C stops at once)."""
        if exc_type is None or issubclass(exc_type, (FloatingPointError, _cli.Stopped)):
            self.close()
        elif not issubclass(exc_type, KeyboardInterrupt):
            self.abandon()

    def abandon(self) -> None:
        """Releases the manager after a failure, raising nothing.

        Orbax's own error logs stay filtered: its background threads may
        still report the same failure until the process ends.
        """
        try:
            self.manager.close()
        except Exception:  # noqa: BLE001, S110 - the failure was reported already
            pass
