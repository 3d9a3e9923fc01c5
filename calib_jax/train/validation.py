"""Every check of a training config that needs neither the data nor a workdir.

:func:`validate` is what the trainer runs before it touches anything, and what
the benchmark runs for the config of every cell before it writes anything:
numbers and their domains, names (losses and their hyperparameters, model,
augmentation, shifts, OOD set), batch sizes against the devices, and the
memory of loss terms whose size grows with a bin count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from calib_jax import _memory, losses, objectives
from calib_jax import data as data_lib
from calib_jax.train import evaluate as eval_lib
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import sharded_step, two_stage

CALIBRATION_STATS = ("global", "per_device")
# A loss term with a ``num_bins`` is measured (compiled for its memory) only
# when one [rows, num_bins] float32 array, a lower bound, exceeds this.
MEASURE_ABOVE_BYTES = 2**26


def _term_bytes(term: dict, rows: int, num_classes: int) -> int:
    """Memory of one loss term and its gradient on ``rows`` rows, from XLA.

    The term is compiled (not run) for a [rows, num_classes] batch; without
    XLA's memory analysis, one [rows, num_bins] float32 array is the estimate.
    """
    objective = losses.composite([term])

    def grad(logits, labels, mask):
        return jax.grad(lambda z: objective(z, labels, mask)[0])(logits)

    args = (
        jax.ShapeDtypeStruct((rows, num_classes), jnp.float32),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct((rows,), jnp.bool_),
    )
    stats = jax.jit(grad).lower(*args).compile().memory_analysis()
    if stats is None:
        return 4 * rows * int(term["num_bins"])
    return int(
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
    )


def check_loss_memory(config: ConfigDict, num_classes: int, what: str = "loss"):
    """ValueError (one line) for a loss term whose bins cannot fit in memory.

    A term's ``num_bins`` sets the size of its per-step arrays (a soft
    binning is a [rows, num_bins] membership matrix): a huge count would
    fail only after the run started, in XLA's allocation. The rows are the
    training batch's share of one device.
    """
    field = config
    for key in what.split("."):
        field = field[key]
    terms = objectives.loss_terms(field, what)
    keys = objectives.term_keys([term["name"] for term in terms])
    rows = -(-int(config.batch_size) // jax.device_count())
    for key, term in zip(keys, terms, strict=True):
        bins = term.get("num_bins")
        if not isinstance(bins, int) or 4 * rows * bins <= MEASURE_ABOVE_BYTES:
            continue
        _memory.check_fits(
            _term_bytes(dict(term), rows, num_classes),
            f"config.{what}.{key}.num_bins={bins} (the loss term and its gradient "
            f"on {rows} rows per device)",
            fix=f"lower config.{what}.{key}.num_bins",
        )


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


def validate(config: ConfigDict) -> data_lib.Dataset:
    """Checks a training config completely before anything is computed or written.

    Numbers and their domains, ``calibration_stats``, the batch sizes against
    the devices of the mesh, the loss terms (names, hyperparameters and their
    domains, of ``config.loss`` and of an interleaved run's secondary), the
    interleaved hold-out fraction, the memory of loss terms with a bin count
    (:func:`check_loss_memory`), the augmentation, the model (unless MaC-Cal
    stage II replaces its head), stage II's numbers, the dataset, the shifted
    test sets and the OOD set. What it leaves to the run: the workdir and
    stage II's stage-I run (:func:`calib_jax.train.setup.build` checks both
    before writing).

    Args:
      config: a training config (``configs/*.py``).

    Returns:
      The config's dataset (opened for the checks, for a caller that goes on
      to build the run).

    Raises:
      ValueError: one line naming the field, the value and the valid set.
    """
    check_numbers(config)
    dataset = data_lib.get_dataset(
        config.dataset.name, data_dir=config.dataset.data_dir or None
    )
    if config.calibration_stats not in CALIBRATION_STATS:
        raise ValueError(
            f"config.calibration_stats must be one of {', '.join(CALIBRATION_STATS)}, "
            f"got '{config.calibration_stats}'."
        )
    mesh = mesh_lib.data_mesh()
    mesh_lib.check_batch_size(config.batch_size, mesh)
    mesh_lib.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")
    sharded_step.make_objective(config, "loss")
    check_loss_memory(config, dataset.num_classes, "loss")
    if config.interleaved.enabled:
        sharded_step.make_objective(config, "interleaved.secondary")
        check_loss_memory(config, dataset.num_classes, "interleaved.secondary")
        if not 0 < config.interleaved.holdout_fraction < 1:  # NaN fails too
            raise ValueError(
                "config.interleaved.holdout_fraction must be in (0, 1), got "
                f"{config.interleaved.holdout_fraction}."
            )
    sharded_step.make_augment(config)
    if config.two_stage.enabled:
        two_stage.check_config(config)
    else:
        sharded_step.make_model(config, dataset.num_classes)
    eval_lib.resolve_shifts(config, dataset)
    eval_lib.resolve_ood(config, dataset)
    return dataset
