"""The host training loop: config in, checkpoints, JSONL metrics and logits out.

One concern per module: :mod:`.preemption` (SIGTERM/SIGINT into a stop
request), :mod:`.metrics_log` (``metrics.jsonl``), :mod:`.checkpoint` and the
epoch loop here. Every resource of a run (the workdir lock, the TensorBoard
writer, the checkpointer, and while the steps run the progress bar, the input
prefetch, the signal handlers and ``debug_nans``) is held by one
``contextlib.ExitStack``, which releases each whatever way the run ends.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import signal

import jax
import jax.numpy as jnp
from etils import epath
from ml_collections import ConfigDict

from calib_jax import progress as progress_lib
from calib_jax import metrics, plots, storage, tensorboard
from calib_jax.data import prefetch
from calib_jax.train import metrics_log
from calib_jax.train import setup as setup_lib
from calib_jax.train import workdir as workdir_lib
from calib_jax.train.checkpoint import Checkpointer
from calib_jax.train.preemption import Interrupted, Preemption


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


def _reliability_image(tb, rows, step: int) -> None:
    """The final test set's reliability diagram, from its top-label rows (the
    evaluation's per-row confidence and correctness of the whole set)."""
    if isinstance(tb, tensorboard.NoWriter) or rows is None:
        return
    if jax.process_index() != 0:
        return
    top = metrics.TopLabelRows(rows.confidence, rows.correct)
    tb.image(
        "test/reliability",
        step,
        plots.reliability_diagram(top, None, title=f"test, step {step}"),
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
    and while ``metrics.jsonl`` is appended with a
    :class:`~calib_jax.train.metrics_log.MetricsWriteError`;
    rerun to resume from the last complete checkpoint. SIGTERM saves a
    checkpoint at the next step boundary and returns ``{}``; SIGINT (Ctrl-C)
    does the same, then raises
    :class:`~calib_jax.train.preemption.Interrupted`. ``progress=False``
    hides the bars of the steps and of the evaluation; ``progress_level=1``
    draws them under an outer bar (the benchmark's cell bar). Returns the
    final evaluation. ``workdir`` may be local or a ``gs://`` URL.
    """
    workdir = storage.as_path(workdir, what="--workdir")
    run = setup_lib.build(config, workdir)  # validates; raises ValueError
    with contextlib.ExitStack() as stack:
        stack.enter_context(workdir_lib.lock(workdir))  # before the checkpoints
        tb = stack.enter_context(tensorboard.from_config(config, workdir))
        ckpt = stack.enter_context(
            Checkpointer(
                workdir, save_timeout_s=config.get("checkpoint_timeout_s", 1200)
            )
        )
        return _train(config, workdir, run, ckpt, tb, stack, progress, progress_level)


def _train(
    config: ConfigDict,
    workdir: epath.Path,
    run: setup_lib.Run,
    ckpt: Checkpointer,
    tb,
    stack: contextlib.ExitStack,
    progress: bool,
    progress_level: int,
) -> dict[str, float]:
    writer = metrics_log.JsonlWriter(workdir / "metrics.jsonl")

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

    acc = {}
    eval_progress = progress_level if progress else None
    # The resources of the steps, closed when they end (or with the run).
    steps = stack.enter_context(contextlib.ExitStack())
    bar = progress_lib.bar(
        run.num_steps,
        initial=start,
        desc=f"train {config.model.name}/{config.dataset.name}",
        unit="step",
        enabled=progress and jax.process_index() == 0,
        level=progress_level,
    )
    preempt = steps.enter_context(Preemption())
    steps.enter_context(jax.debug_nans(bool(config.get("debug_nans", False))))
    # The next batches are gathered and placed on the mesh on a thread while
    # the devices work; each is the same function of (seed, step) as without.
    feed = steps.enter_context(
        prefetch.Prefetcher(
            map(run.batch, range(start, run.num_steps)), config.input.prefetch
        )
    )
    steps.enter_context(bar)
    window = start + 1  # first step of the current logging window
    run_ahead = RunAhead.for_backend()
    for step in range(start, run.num_steps):
        state, metrics = run.train(state, next(feed))  # debug_nans: names the op
        run_ahead.push(metrics)
        # Sums stay on device; the host reads them only when logging.
        acc = metrics_log.accumulate(acc, metrics)
        done = step + 1
        bar.update(1)
        if done % config.log_every == 0 or done == run.num_steps:
            # Share of this interval's wall time spent blocked on input.
            wait = feed.wait_fraction()
            logged = metrics_log.summarise(acc)
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
                what = f"{bad[0]} is {logged[bad[0]]} in steps {window}-{done}"
                raise _diverged(what, ckpt)
            window = done + 1
        if done % config.checkpoint_every == 0 or done == run.num_steps:
            # Never save a non-finite state over the good checkpoints.
            if not bool(jax.device_get(_all_finite(state.params))):
                raise _diverged(
                    f"the parameters are not finite after step {done}", ckpt
                )
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
            if preempt.signal == signal.SIGINT:
                raise Interrupted(
                    f"interrupted: saved step {done} in {workdir}; rerun the "
                    "same command to resume."
                )
            logging.warning(
                "SIGTERM: saved step %d and stopped; rerun to resume.", done
            )
            return {}
    steps.close()
    final_step = int(jax.device_get(state.step))
    summary = run.evaluate(state, export=True, progress=eval_progress)
    writer.write(final_step, summary, replace=True)
    tb.scalars(final_step, summary)
    _reliability_image(tb, run.evaluate.rows.get("test"), final_step)
    ckpt.save(state)
    return summary
