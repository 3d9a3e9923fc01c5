"""The host training loop: config in, checkpoints, JSONL metrics and logits out."""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import signal
import time

import jax
import jax.numpy as jnp
from etils import epath
from jax.experimental import multihost_utils
from ml_collections import ConfigDict

from calib_jax import progress as progress_lib
from calib_jax import _cli, storage, tensorboard
from calib_jax.data import prefetch
from calib_jax.train import setup as setup_lib
from calib_jax.train import workdir as workdir_lib
from calib_jax.train.checkpoint import Checkpointer, CheckpointSaveError


class Interrupted(_cli.Stopped):
    """SIGINT (Ctrl-C) stopped the run after saving a checkpoint (exit
    status 130); one-line message."""


class MetricsWriteError(_cli.StorageWriteError):
    """Storage failed while ``metrics.jsonl`` was appended; its message is one line."""


class _Preemption:
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


class JsonlWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl`` (process 0).

    In an object store (no append) each write rewrites the file whole. A
    record is written in one call; when storage fails (a full disk), a local
    file is cut back to its last whole record and :class:`MetricsWriteError`
    is raised (a torn line that stays is dropped on resume,
    :meth:`truncate_after`).
    """

    def __init__(self, path: epath.PathLike):
        self.path = storage.as_path(path)

    def write(self, step: int, values: dict, *, replace: bool = False) -> None:
        """Appends one record; ``replace``: drops an older one of its step and keys.

        (A finished run that is run again evaluates its last step again.)
        """
        if jax.process_index() != 0:
            return
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({k: float(v) for k, v in values.items()})
        if replace and self.path.exists():
            kind = _kind(row)
            lines = self.path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not _same_record(line, row, kind)]
            if len(kept) != len(lines):
                self._rewrite("".join(kept) + json.dumps(row) + "\n")
                return
        self._append(json.dumps(row) + "\n")

    def _append(self, line: str) -> None:
        remote = storage.is_remote(self.path)
        size = None if remote or not self.path.exists() else os.path.getsize(self.path)
        try:
            storage.append_text(self.path, line)
        except OSError as e:
            if not remote:
                try:  # drop the part of the record that was written
                    os.truncate(self.path, size or 0)
                except OSError:
                    pass  # the reader drops a torn last line on resume
            raise self._failed("append to", e) from None

    def _rewrite(self, text: str) -> None:
        """Replaces the file whole (the old one stays when the write fails)."""
        try:
            storage.write_text(self.path, text)
        except OSError as e:
            raise self._failed("rewrite", e) from None

    def _failed(self, what: str, err: OSError) -> MetricsWriteError:
        return MetricsWriteError(
            f"could not {what} {self.path}: {storage.os_error_text(err)}; free "
            "space and rerun the same command to resume from the last checkpoint."
        )

    def truncate_after(self, step: int) -> None:
        """Drops the records of steps after ``step`` (and a torn last line).

        Called on resume: a run killed after its last checkpoint logged steps
        it will now log again. The file is rewritten whole, only when
        something is dropped.
        """
        if jax.process_index() != 0 or not self.path.exists():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) is not None]
        kept = [line for line in kept if _step_of(line) <= step]
        if len(kept) != len(lines) or (kept and not kept[-1].endswith("\n")):
            self._rewrite("".join(kept))


def _kind(row: dict) -> tuple:
    """What tells records of one step apart: their keys (time aside)."""
    return tuple(sorted(k for k in row if k != "time"))


def _same_record(line: str, row: dict, kind: tuple) -> bool:
    if _step_of(line) != row["step"]:
        return False
    return _kind(json.loads(line)) == kind


def _step_of(line: str) -> int | None:
    """The step of one metrics.jsonl line; None when it is not a whole record."""
    if not line.endswith("\n"):
        return None  # the write of this line was cut short
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) else None


@jax.jit
def _add_metrics(sums: dict, metrics: dict) -> dict:
    """``sums[key] + metrics[key]`` for every key (one compiled program)."""
    return {key: sums[key] + value for key, value in metrics.items()}


def _accumulate(acc: dict, metrics: dict) -> dict:
    """Adds one step's metrics to the running sums (on device, no host sync).

    Interleaved training alternates steps with different loss terms, so every
    key keeps its own step count. The additions of one step are one compiled
    program (one dispatch, however many metrics there are).
    """
    # A new key starts from a traced 0.0, as the eager ``0.0 + value`` did.
    sums = _add_metrics({k: acc.get(k, (0.0, 0))[0] for k in metrics}, metrics)
    out = dict(acc)
    for key, total in sums.items():
        out[key] = (total, acc.get(key, (0.0, 0))[1] + 1)
    return out


class RunAhead:
    """Bounds how many dispatched steps may wait for the devices.

    XLA:CPU runs each virtual device's share of a program on one thread pool
    shared by all devices. With tens of multi-device programs in flight, the
    participants of a collective can fill the pool while they wait for others
    queued behind them, and the runtime then aborts the process ("Termination
    timeout ... Exiting to ensure a consistent program state", after 40 s).
    :meth:`push` of step ``k``'s outputs therefore waits for those of step
    ``k - limit``: the host stays at most ``limit`` steps ahead, never syncing
    on the step it just dispatched.

    Args:
      limit: steps the host may run ahead (>= 1); None never waits.
    """

    def __init__(self, limit: int | None):
        self.limit = limit
        self._pending: collections.deque = collections.deque()

    @classmethod
    def for_backend(cls) -> RunAhead:
        """:data:`CPU_RUN_AHEAD` on the CPU; accelerator runtimes queue freely."""
        return cls(CPU_RUN_AHEAD if jax.default_backend() == "cpu" else None)

    def push(self, outputs) -> None:
        """Records a dispatched step's ``outputs`` (any pytree of arrays)."""
        if self.limit is None:
            return
        self._pending.append(outputs)
        while len(self._pending) > self.limit:
            jax.block_until_ready(self._pending.popleft())


# Steps the training loop runs ahead of XLA:CPU devices (see RunAhead).
CPU_RUN_AHEAD = 2


@jax.jit
def _all_finite(tree) -> jax.Array:
    """Whether every float leaf of ``tree`` is finite (one fused device pass)."""
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _diverged(what: str, ckpt: Checkpointer) -> FloatingPointError:
    """The error that stops a run whose loss or parameters went non-finite."""
    ckpt.wait()
    latest = ckpt.manager.latest_step()
    kept = (
        f"the good checkpoints end at step {latest}"
        if latest is not None
        else "no checkpoint was saved"
    )
    return FloatingPointError(
        f"training diverged: {what}; {kept}. Lower the learning rate, or rerun "
        "with --config.debug_nans=True to name the first operation that made a NaN."
    )


def _summarise(acc: dict) -> dict[str, float]:
    """Turns accumulated step metrics into means (losses) and ratios (sums)."""
    acc = {k: (float(v), n) for k, (v, n) in jax.device_get(acc).items()}
    sums = ("train/count", "train/correct", "train/confidence")
    out = {k: v / n for k, (v, n) in acc.items() if k not in sums}
    if "train/count" in acc:
        count = max(acc["train/count"][0], 1.0)
        out["train/accuracy"] = acc["train/correct"][0] / count
        out["train/confidence"] = acc["train/confidence"][0] / count
    return out


def _reliability_image(tb, workdir: epath.Path, step: int) -> None:
    """The final test set's reliability diagram, from the exported logits."""
    path = workdir / "logits" / "test.npz"
    if isinstance(tb, tensorboard.NoWriter) or not path.exists():
        return
    f = storage.load_npz(path)
    tb.reliability(
        "test/reliability", step, f["logits"], f["labels"], title=f"test, step {step}"
    )


def train_and_evaluate(
    config: ConfigDict,
    workdir: str | epath.PathLike,
    *,
    progress: bool = True,
    progress_level: int = 0,
) -> dict[str, float]:
    """Trains as ``config`` says, resuming from the latest checkpoint in ``workdir``.

    Everything that can be wrong with the config, the names in it or the
    workdir (and the TensorBoard log directory of ``config.log``) is checked
    before any compute, and before anything is written to the workdir. The
    run then holds the workdir's lock (:func:`calib_jax.train.workdir.lock`):
    a second run in the same workdir is refused with a ``ValueError``.
    Storage that fails while a checkpoint is saved stops the run with a
    :class:`~calib_jax.train.checkpoint.CheckpointSaveError` naming the path,
    and while ``metrics.jsonl`` is appended with a :class:`MetricsWriteError`;
    rerun to resume from the last complete checkpoint. SIGTERM saves a
    checkpoint at the next step boundary and returns ``{}``; SIGINT (Ctrl-C)
    does the same, then raises :class:`Interrupted`. ``progress=False``
    hides the bars of the steps and of the evaluation; ``progress_level=1``
    draws them under an outer bar (the benchmark's cell bar). Returns the
    final evaluation. ``workdir`` may be local or a ``gs://`` URL.
    """
    workdir = storage.as_path(workdir, what="--workdir")
    run = setup_lib.build(config, workdir)  # validates; raises ValueError
    with workdir_lib.lock(workdir):  # before the checkpoints are touched
        tb = tensorboard.from_config(config, workdir)  # raises ValueError
        ckpt = Checkpointer(
            workdir, save_timeout_s=config.get("checkpoint_timeout_s", 1200)
        )
        try:
            return _train(config, workdir, run, ckpt, tb, progress, progress_level)
        except (CheckpointSaveError, MetricsWriteError):
            tb.close()
            ckpt.abandon()  # storage failed; the error names the path
            raise


def _train(
    config: ConfigDict,
    workdir: epath.Path,
    run: setup_lib.Run,
    ckpt: Checkpointer,
    tb,
    progress: bool,
    progress_level: int,
) -> dict[str, float]:
    writer = JsonlWriter(workdir / "metrics.jsonl")

    state = ckpt.restore_latest(run.abstract_state)
    if state is None:
        state = run.init_state()
        start = 0
    else:
        start = int(jax.device_get(state.step))
        logging.info("Resumed from step %d in %s", start, workdir)
        tb.resume_at(start + 1)  # the steps after the checkpoint are rerun
    # Steps after the restored one run again: their old records go.
    writer.truncate_after(start)

    summary = {}
    acc = {}
    primary = progress and jax.process_index() == 0
    bar = progress_lib.bar(
        run.num_steps,
        initial=start,
        desc=f"train {config.model.name}/{config.dataset.name}",
        unit="step",
        enabled=primary,
        level=progress_level,
    )
    eval_progress = progress_level if progress else None

    def stop(what: str) -> FloatingPointError:
        bar.close()
        tb.close()
        err = _diverged(what, ckpt)
        ckpt.close()
        return err

    window = start + 1  # first step of the current logging window
    run_ahead = RunAhead.for_backend()
    debug_nans = jax.debug_nans(bool(config.get("debug_nans", False)))
    # The next batches are gathered and placed on the mesh on a thread while
    # the devices work; each is the same function of (seed, step) as without.
    feed = prefetch.Prefetcher(
        map(run.batch, range(start, run.num_steps)), config.input.prefetch
    )
    with _Preemption() as preempt, debug_nans, feed, bar:  # bar: closed on errors
        for step in range(start, run.num_steps):
            batch = next(feed)
            try:
                state, metrics = run.train(state, batch)
            except FloatingPointError:  # debug_nans named the operation
                bar.close()
                tb.close()
                ckpt.close()
                raise
            run_ahead.push(metrics)
            # Sums stay on device; the host reads them only when logging.
            acc = _accumulate(acc, metrics)
            done = step + 1
            bar.update(1)
            if done % config.log_every == 0 or done == run.num_steps:
                # Share of this interval's wall time spent blocked on input.
                wait = feed.wait_fraction()
                logged = _summarise(acc)
                logged["train/input_wait_fraction"] = wait
                acc = {}
                logged["learning_rate"] = float(run.schedule(step))
                writer.write(done, logged)
                tb.scalars(done, logged)
                loss = logged.get("loss/total", float("nan"))
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
                bad = sorted(
                    k
                    for k, v in logged.items()
                    if k.startswith("loss/") and not math.isfinite(v)
                )
                if bad:
                    raise stop(f"{bad[0]} is {logged[bad[0]]} in steps {window}-{done}")
                window = done + 1
            if done % config.checkpoint_every == 0 or done == run.num_steps:
                # Never save a non-finite state over the good checkpoints.
                if not bool(jax.device_get(_all_finite(state.params))):
                    raise stop(f"the parameters are not finite after step {done}")
                ckpt.save(state)
            if (
                config.eval_every
                and done % config.eval_every == 0
                and done != run.num_steps
            ):
                evaluated = run.evaluate(state, export=False, progress=eval_progress)
                writer.write(done, evaluated)
                tb.scalars(done, evaluated)
            if preempt.stop_after(done) and done != run.num_steps:
                ckpt.save(state, force=True)
                ckpt.close()
                bar.close()
                tb.close()
                if preempt.signal == signal.SIGINT:
                    raise Interrupted(
                        f"interrupted: saved step {done} in {workdir}; rerun the "
                        "same command to resume."
                    )
                logging.warning(
                    "SIGTERM: saved step %d and stopped; rerun to resume.", done
                )
                return {}
    bar.close()
    final_step = int(jax.device_get(state.step))
    summary = run.evaluate(state, export=True, progress=eval_progress)
    writer.write(final_step, summary, replace=True)
    tb.scalars(final_step, summary)
    _reliability_image(tb, workdir, final_step)
    tb.close()
    ckpt.save(state)
    ckpt.close()
    return summary


def load_jsonl(path: str | epath.PathLike) -> list[dict]:
    """Reads a metrics.jsonl file (local or in an object store), each record once.

    A step has up to three records, each with its own keys (training
    metrics, a periodic evaluation, the final evaluation). Logs of older runs
    that were resumed after a crash can repeat a record; of records with the
    same step and the same keys only the last is kept, in its place
    (:func:`calib_jax.storage.read_jsonl`: a line cut short is left out).
    """
    rows = storage.read_jsonl(path)
    last = {}
    for i, row in enumerate(rows):
        last[(row.get("step"), _kind(row))] = i
    keep = sorted(last.values())
    return [rows[i] for i in keep]
