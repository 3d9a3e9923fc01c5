"""Assembles a run from a config: validation, data, model, loss, optimizer, steps.

``build`` does every check that can fail on the config, the names in it or the
workdir *before* any compute, and returns a :class:`Run` whose ``step`` and
``evaluate`` the host loop calls. Evaluation itself (shift and OOD sets,
metrics, the logits export) is :mod:`calib_jax.train.evaluate`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from etils import epath
from ml_collections import ConfigDict

from calib_jax import data as data_lib
from calib_jax import losses, storage
from calib_jax import progress as progress_lib
from calib_jax.data import cache as cache_lib
from calib_jax.data import pipeline
from calib_jax.data._sources import SubsetSource
from calib_jax.train import evaluate as eval_lib
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import sharded_step, two_stage
from calib_jax.train.state import TrainState

CALIBRATION_STATS = ("global", "per_device")
# Shift resolution lives with the evaluation (calib_jax.train.evaluate).
resolve_shifts = eval_lib.resolve_shifts
# Keys that may differ between the config of a run and its resumption.
_RESUMABLE_KEYS = (
    "log_every",
    "eval_every",
    "checkpoint_every",
    "checkpoint_timeout_s",
    "eval_batch_size",
    "debug_nans",
    "input",
    "log",
)


def _resolved(config: ConfigDict) -> dict:
    return json.loads(config.to_json_best_effort())


def check_workdir(
    config: ConfigDict, workdir: str | epath.PathLike, *, write: bool = True
) -> None:
    """Checks that ``workdir`` can hold this run; writes ``config.json`` if new.

    A ``gs://`` workdir is checked first: a malformed URL, a missing bucket or
    an unreachable store is a one-line ``ValueError`` naming it. A workdir
    that holds ``config.json`` must hold a run of the same config.
    ``write=False`` only checks (nothing is created), so that every other
    check can run before the workdir is touched.
    """
    workdir = storage.as_path(workdir, what="--workdir")
    storage.check_reachable(workdir, what="--workdir")
    path = workdir / "config.json"
    new = _resolved(config)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} exists and is not a directory.")
    if path.exists():
        old = json.loads(path.read_text())
        strip = lambda d: {k: v for k, v in d.items() if k not in _RESUMABLE_KEYS}  # noqa: E731
        if strip(old) != strip(new):
            diff = sorted(
                k for k in set(old) | set(new) if strip(old).get(k) != strip(new).get(k)
            )
            raise ValueError(
                f"{workdir} holds a run of a different config (differs in: "
                f"{', '.join(diff)}); use a new --workdir or the same config."
            )
        return
    if write and jax.process_index() == 0:
        try:
            storage.make_dirs(workdir)
        except OSError as e:
            msg = f"cannot create --workdir {workdir}: {e.strerror}."
            raise ValueError(msg) from None
        # Written whole (renamed into place, or one upload): another process
        # checking a shared workdir never reads a half-written file.
        storage.write_text(path, json.dumps(new, indent=2, sort_keys=True) + "\n")


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


def check_numbers(config: ConfigDict) -> None:
    """ValueError (one line, naming the field) for a number outside its domain."""
    positive_ints = (
        "batch_size",
        "eval_batch_size",
        "log_every",
        "checkpoint_every",
        "checkpoint_timeout_s",
    )
    for key in positive_ints:
        if not config[key] > 0:
            raise ValueError(f"config.{key} must be a positive int, got {config[key]}.")
    for key in ("eval_every", "seed", "num_steps"):
        if config[key] < 0:
            raise ValueError(f"config.{key} must be >= 0, got {config[key]}.")
    if not (config.num_steps > 0 or config.num_epochs > 0):  # NaN epochs fail too
        raise ValueError(
            "Set config.num_steps or config.num_epochs to a positive number, got "
            f"num_steps={config.num_steps}, num_epochs={config.num_epochs}."
        )
    o, s = config.optimizer, config.schedule
    checks = [
        ("optimizer.learning_rate", o.learning_rate, o.learning_rate > 0, "> 0"),
        ("optimizer.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
        ("optimizer.momentum", o.momentum, 0 <= o.momentum < 1, "in [0, 1)"),
        ("schedule.warmup_steps", s.warmup_steps, s.warmup_steps >= 0, ">= 0"),
        ("schedule.decay_factor", s.decay_factor, s.decay_factor > 0, "> 0"),
        ("input.prefetch", config.input.prefetch, config.input.prefetch >= 0, ">= 0"),
        (
            "input.memory_gb",
            config.input.memory_gb,
            config.input.memory_gb >= 0,
            ">= 0",
        ),
        (
            "input.decode_workers",
            config.input.decode_workers,
            config.input.decode_workers >= 0,
            ">= 0",
        ),
    ]
    for name, value, ok, domain in checks:
        if not ok:  # NaN fails every comparison
            raise ValueError(f"config.{name} must be {domain}, got {value}.")
    if o.decay not in ("all", "kernels"):
        raise ValueError(
            f"config.optimizer.decay must be 'all' or 'kernels', got '{o.decay}'."
        )
    bounds = list(s.boundaries)
    if bounds != sorted(bounds) or any(not 0 < b < 1 for b in bounds):
        raise ValueError(
            "config.schedule.boundaries must be increasing fractions of training "
            f"in (0, 1), got {tuple(bounds)}."
        )


def check_config(config: ConfigDict, dataset) -> None:
    """Every check of ``config`` that needs neither the data nor a workdir.

    Numbers, names (losses, model, augmentation, shifts, OOD set) and batch
    sizes against the devices; what the benchmark runs for every method's
    config before it writes anything. The two-stage method's stage-I workdir
    is checked by :func:`build`.

    Raises:
      ValueError: one line naming the field, the value and the valid set.
    """
    check_numbers(config)
    if config.calibration_stats not in CALIBRATION_STATS:
        raise ValueError(
            f"config.calibration_stats must be one of {', '.join(CALIBRATION_STATS)}, "
            f"got '{config.calibration_stats}'."
        )
    mesh = mesh_lib.data_mesh()
    mesh_lib.check_batch_size(config.batch_size, mesh)
    mesh_lib.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")
    losses.composite(config.loss)
    if config.interleaved.enabled:
        losses.composite(config.interleaved.secondary)
        if not 0 < config.interleaved.holdout_fraction < 1:  # NaN fails too
            raise ValueError(
                "config.interleaved.holdout_fraction must be in (0, 1), got "
                f"{config.interleaved.holdout_fraction}."
            )
    sharded_step.make_augment(config)
    if not config.two_stage.enabled:
        sharded_step.make_model(config, dataset.num_classes)
    eval_lib.resolve_shifts(config, dataset)
    eval_lib.resolve_ood(config, dataset)


def build(config: ConfigDict, workdir: str | epath.PathLike) -> Run:
    """Validates ``config`` and returns the assembled run (no training yet)."""
    workdir = storage.as_path(workdir, what="--workdir")
    check_numbers(config)
    dataset = data_lib.get_dataset(
        config.dataset.name, data_dir=config.dataset.data_dir or None
    )
    # Fail on a bad loss term, model or augmentation before touching the workdir.
    check_config(config, dataset)
    mesh = mesh_lib.data_mesh()
    if config.two_stage.enabled:
        stage = two_stage.build_stage_two(config, dataset)  # validates stage-I dir
        model = None
    else:
        stage = None
        model = sharded_step.make_model(config, dataset.num_classes)
    shifts = eval_lib.resolve_shifts(config, dataset)
    ood = eval_lib.resolve_ood(config, dataset)
    # Refuses a workdir of another run now; config.json is written only once
    # every check below has passed too, so a rejected config leaves no trace.
    check_workdir(config, workdir, write=False)

    # ---- data sources and the step -> batch map --------------------------------
    # Each split is decoded once (calib_jax.data.cache); batches are gathered
    # from the arrays and travel as stored (uint8 for CIFAR).
    splits = cache_lib.SplitCache(
        memory_bytes=config.input.memory_gb * 2**30,
        cache_dir=config.input.cache_dir or None,
        workers=config.input.decode_workers,
    )
    train_source = splits.get(dataset.source(config.dataset.train_split))
    b = config.batch_size
    pidx, pcount = jax.process_index(), jax.process_count()
    if config.interleaved.enabled:
        order = np.random.default_rng(1234).permutation(len(train_source))
        n_hold = int(round(config.interleaved.holdout_fraction * len(order)))
        if not 0 < n_hold < len(order):
            raise ValueError(
                "config.interleaved.holdout_fraction leaves no example on one side "
                f"of the {len(order)} training examples, got "
                f"{config.interleaved.holdout_fraction}."
            )
        major = SubsetSource(train_source, np.sort(order[n_hold:]))
        held = SubsetSource(train_source, np.sort(order[:n_hold]))
        major_steps, held_steps = math.ceil(len(major) / b), math.ceil(len(held) / b)
        steps_per_epoch = major_steps + held_steps
    else:
        steps_per_epoch = math.ceil(len(train_source) / b)
    num_steps = _num_steps(config, steps_per_epoch)

    def host_batch(step: int) -> tuple[bool, dict]:
        """(is_secondary, process-local batch) for a global step."""
        kw = dict(
            batch_size=b,
            seed=config.seed,
            process_index=pidx,
            process_count=pcount,
            to_float=False,
        )
        if not config.interleaved.enabled:
            return False, pipeline.train_batch(train_source, step=step, **kw)
        epoch, pos = divmod(step, steps_per_epoch)
        if pos < major_steps:
            return False, pipeline.train_batch(
                major, step=epoch * major_steps + pos, **kw
            )
        index = epoch * held_steps + pos - major_steps
        return True, pipeline.train_batch(held, step=index, **kw)

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

    def evaluate(state, *, export: bool, progress: int | None = None) -> dict:
        # progress: None shows nothing; else the bar's level (0, or 1 under
        # the benchmark's cell bar).
        show = progress is not None and jax.process_index() == 0
        total = sum(len(s.source) for s in sets)
        level = progress or 0
        with progress_lib.Progress(total, enabled=show, level=level) as bar:
            results, logits = eval_lib.evaluate(
                config, sets, steps.eval, state, put, splits, progress=bar
            )
        if export and jax.process_index() == 0:
            name = ood.name if ood is not None else ""
            eval_lib.export_logits(workdir / "logits", logits, name)
        return results

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
