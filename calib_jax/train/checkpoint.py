"""A thin wrapper over Orbax's CheckpointManager: save, and resume from the latest good one."""

from __future__ import annotations

import logging

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from calib_jax import storage
from calib_jax.train.state import TrainState


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
    """The newest checkpoint of ``workdir`` that restores into ``abstract_state``.

    Unlike :meth:`Checkpointer.restore_latest`, the run's directory is never
    changed: an unreadable checkpoint is skipped with a warning, not moved,
    and unfinished saves are left alone (evaluating a run must not alter it).

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
                restored = manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state)
                    ),
                )
            except Exception as e:  # noqa: BLE001 - any read failure means skip it
                first = str(e).splitlines()[0] if str(e) else ""
                errors.append(f"step {step}: {type(e).__name__}: {first}")
                logging.warning(
                    "Skipping checkpoint %s that does not restore (%s).",
                    directory / str(step),
                    errors[-1],
                )
                continue
            return restored["state"], step
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
    shardings the step expects. A checkpoint that cannot be read (partially
    written, truncated or missing files) is skipped with a warning that names
    it, and the previous one is tried. Once a readable one is found, the
    unreadable newer ones are moved (not deleted) to
    ``<workdir>/checkpoints_unreadable/<step>``, so that training saves those
    steps again when it reaches them.

    A save cut short (SIGKILL) is never a checkpoint: Orbax deletes its
    leftovers when the next run creates the manager.

    ``workdir`` may be a ``gs://`` URL: Orbax then writes the array data
    through tensorstore and marks a finished step with ``commit_success.txt``
    (an object store has no atomic rename); unreadable steps are moved aside
    by copying their objects, then deleting them.
    """

    def __init__(self, workdir: str | epath.PathLike, *, max_to_keep: int | None = 3):
        self.directory = storage.absolute(workdir) / "checkpoints"
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
            ),
        )

    def save(self, state: TrainState, *, force: bool = False) -> None:
        step = int(jax.device_get(state.step))
        if step in self.manager.all_steps():
            return
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
            force=force,
        )

    def restore_latest(self, abstract_state: TrainState) -> TrainState | None:
        """The newest readable checkpoint, or None when there is none."""
        unreadable = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state)
                    ),
                )
            except Exception as e:  # noqa: BLE001 - any read failure means skip it
                logging.warning(
                    "Skipping unreadable checkpoint %s (%s: %s); trying the previous one.",
                    self.directory / str(step),
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                )
                unreadable.append(step)
                continue
            self._set_aside(unreadable)
            return restored["state"]
        self._set_aside(unreadable)
        return None

    def _set_aside(self, steps: list[int]) -> None:
        """Moves unreadable step directories out of the manager's way."""
        if not steps:
            return
        if jax.process_index() == 0:
            aside = self.directory.parent / "checkpoints_unreadable"
            storage.make_dirs(aside)
            for step in steps:
                target = aside / str(step)
                n = 1
                while target.exists():  # the same step went bad before
                    target, n = aside / f"{step}.{n}", n + 1
                storage.move_tree(self.directory / str(step), target)
                logging.warning(
                    "Moved unreadable checkpoint %s to %s; step %d will be saved again.",
                    self.directory / str(step),
                    target,
                    step,
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("calib_jax_checkpoint_set_aside")
        self.manager.reload()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
