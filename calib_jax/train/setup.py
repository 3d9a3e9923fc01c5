"""Assembles a run from a config: data schedule, steps, evaluation, workdir.

``build`` runs every check that can fail on the config, the names in it or the
workdir (:func:`calib_jax.train.validate`, then the workdir and MaC-Cal's
stage-I run) *before* any compute and before anything is written, and returns
a :class:`Run` whose ``step`` and ``evaluate`` the host loop calls. The pieces
live elsewhere: the step -> batch map in :mod:`calib_jax.data.schedule`, the
jitted steps in :mod:`calib_jax.train.sharded_step`, the evaluation (shift
and OOD sets, metrics, the logits export) in :mod:`calib_jax.train.evaluate`,
the workdir's claim in :mod:`calib_jax.train.workdir`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from etils import epath
from ml_collections import ConfigDict

from calib_jax import storage, tensorboard
from calib_jax.data import cache as cache_lib
from calib_jax.data import schedule as schedule_lib
from calib_jax.train import evaluate as eval_lib
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import sharded_step, two_stage
from calib_jax.train import workdir as workdir_lib
from calib_jax.train.state import TrainState
from calib_jax.train.validation import validate

# Loss terms, compared as the terms they define (either form).
LOSS_FIELDS = ("loss", "interleaved.secondary")
# Fields added since runs were first recorded, with the default a run
# recorded before them behaves as (calib_jax.train.workdir.claim's `added`).
ADDED_FIELDS = {
    "model.dropout_rate": 0.0,
    "mc_dropout": {"num_samples": 0, "seed": 0},
}
# The file that marks a benchmark's workdir (calib_jax.benchmark.runner).
BENCHMARK_FILE = "benchmark_config.json"
# Keys that may differ between the config of a run and its resumption.
RESUMABLE_KEYS = (
    "log_every",
    "eval_every",
    "checkpoint_every",
    "checkpoint_timeout_s",
    "eval_batch_size",
    "debug_nans",
    "input",
    "log",
)


def check_workdir(
    config: ConfigDict, workdir: str | epath.PathLike, *, write: bool = True
) -> None:
    """Checks that ``workdir`` can hold this run; writes ``config.json`` if new.

    :func:`calib_jax.train.workdir.claim` with the trainer's file and the keys
    a resumed run may change (:data:`RESUMABLE_KEYS`); a benchmark's workdir
    is refused.
    """
    workdir_lib.claim(
        config,
        workdir,
        resumable=RESUMABLE_KEYS,
        loss_fields=LOSS_FIELDS,
        added=ADDED_FIELDS,
        foreign={BENCHMARK_FILE: "a benchmark's results"},
        write=write,
    )


@dataclasses.dataclass
class Run:
    """A built run: what the host loop needs."""

    config: ConfigDict
    workdir: epath.Path
    num_steps: int
    schedule: Callable[[int], Any]
    abstract_state: TrainState
    init_state: Callable[[], TrainState]
    step: Callable[[TrainState, int], tuple[TrainState, dict]]
    evaluate: Callable[..., dict[str, float]]
    # batch(step): the step's global batch, placed on the mesh (thread-safe);
    # train(state, batch(step)) == step(state, step).
    batch: Callable[[int], Any]
    train: Callable[[TrainState, Any], tuple[TrainState, dict]]


def _num_steps(config: ConfigDict, steps_per_epoch: int) -> int:
    if config.num_steps > 0:
        return int(config.num_steps)
    if config.num_epochs > 0:
        return int(math.ceil(config.num_epochs * steps_per_epoch))
    raise ValueError("Set config.num_steps or config.num_epochs to a positive number.")


def build(config: ConfigDict, workdir: str | epath.PathLike) -> Run:
    """Validates ``config`` and returns the assembled run (no training yet)."""
    workdir = storage.as_path(workdir, what="--workdir")
    # Fail on a bad number, name, loss term, model or augmentation before
    # touching the workdir.
    dataset = validate(config)
    mesh = mesh_lib.data_mesh()
    if config.two_stage.enabled:
        stage = two_stage.build_stage_two(config, dataset)  # validates stage-I dir
        model = None
    else:
        stage = None
        model = sharded_step.make_model(config, dataset.num_classes)
    shifts = eval_lib.resolve_shifts(config, dataset)
    ood = eval_lib.resolve_ood(config, dataset)
    # MC dropout needs a model with dropout (checked before any compute).
    mc_dropout = eval_lib.check_mc_dropout(config, model, dataset) > 0
    # Refuses a workdir of another run now; config.json is written only once
    # every check below has passed too, so a rejected config leaves no trace.
    check_workdir(config, workdir, write=False)
    if tensorboard.enabled(config):
        tensorboard.check_writable(tensorboard.log_dir(config, workdir))

    # ---- data sources and the step -> batch map --------------------------------
    # Each split is decoded once (calib_jax.data.cache); batches are gathered
    # from the arrays and travel as stored (uint8 for CIFAR).
    splits = cache_lib.SplitCache(
        memory_bytes=config.input.memory_gb * 2**30,
        cache_dir=config.input.cache_dir or None,
        workers=config.input.decode_workers,
    )
    interleaved = config.interleaved
    host_batch = schedule_lib.train_schedule(
        splits.get(dataset.source(config.dataset.train_split)),
        batch_size=config.batch_size,
        seed=config.seed,
        holdout_fraction=interleaved.holdout_fraction if interleaved.enabled else None,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    steps_per_epoch = host_batch.steps_per_epoch
    num_steps = _num_steps(config, steps_per_epoch)

    # ---- model, optimizer, state and the jitted steps ------------------------
    steps = sharded_step.build_sharded_step(
        config,
        dataset,
        mesh,
        num_steps,
        model=model,
        stage=stage,
        steps_per_epoch=steps_per_epoch,
    )
    primary_step, secondary_step = steps.train, steps.secondary
    rows = steps.batch_sharding
    put = lambda batch: mesh_lib.put_batch(batch, rows)  # noqa: E731

    def batch(step):
        is_secondary, local = host_batch(step)
        local = dict(local, mask=np.ones(len(local["label"]), bool))
        return is_secondary, put(local)

    def train(state, placed):
        is_secondary, global_batch = placed
        fn = secondary_step if is_secondary else primary_step
        return fn(state, global_batch)

    def run_step(state, step):
        return train(state, batch(step))

    sets = eval_lib.eval_sets(config, dataset, shifts, ood)
    check_workdir(config, workdir)
    # With MC dropout every evaluation (and the exported logits) is of the
    # mean of config.mc_dropout.num_samples dropout samples.
    eval_step = (
        eval_lib.mc_dropout_step(config, model, dataset, steps)
        if mc_dropout
        else steps.eval
    )
    evaluate = eval_lib.evaluator(
        config,
        sets,
        eval_step,
        put,
        splits,
        logits_dir=workdir / "logits",
        ood_name=ood.name if ood is not None else "",
    )
    return Run(
        config=config,
        workdir=workdir,
        num_steps=num_steps,
        schedule=steps.schedule,
        abstract_state=steps.abstract_state,
        init_state=steps.init_state,
        step=run_step,
        evaluate=evaluate,
        batch=batch,
        train=train,
    )
