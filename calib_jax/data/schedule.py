"""Which training examples each global step reads: plain or interleaved epochs.

A plain schedule draws every step's batch from the whole training source
(:func:`calib_jax.data.pipeline.train_batch`). The interleaved schedule of the
soft-calibration paper (App. B) splits the training source once, by a fixed
permutation, into a majority part and a held-out part; each epoch first steps
through the majority part (the primary objective), then through the held-out
part (the secondary objective). Either way a step's batch is a function of
``(seed, step)`` alone, so a resumed run reads the same batches.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from calib_jax.data import pipeline
from calib_jax.data._sources import Source, SubsetSource

# The permutation that splits the training source of an interleaved run (fixed:
# the split does not depend on the training seed).
HOLDOUT_SEED = 1234


@dataclasses.dataclass(frozen=True)
class TrainSchedule:
    """The step -> batch map of a training run (build with :func:`train_schedule`).

    Attributes:
      primary: the source of the primary steps (all of training, or the
        majority part of an interleaved run).
      held: the held-out source of the secondary steps, or ``None``.
      batch_size: the global batch size.
      seed: the training seed.
      process_index: this process.
      process_count: the number of processes.
    """

    primary: Source
    held: Source | None
    batch_size: int
    seed: int
    process_index: int = 0
    process_count: int = 1

    @property
    def primary_steps(self) -> int:
        """Primary steps per epoch."""
        return math.ceil(len(self.primary) / self.batch_size)

    @property
    def held_steps(self) -> int:
        """Secondary steps per epoch (0 without a held-out part)."""
        if self.held is None:
            return 0
        return math.ceil(len(self.held) / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        """Updates per epoch: the primary and the secondary steps."""
        return self.primary_steps + self.held_steps

    def __call__(self, step: int) -> tuple[bool, dict[str, np.ndarray]]:
        """``(is_secondary, this process's batch)`` of global step ``step``.

        Images are as stored (uint8 for CIFAR); ``label`` is int32.
        """
        kw = dict(
            batch_size=self.batch_size,
            seed=self.seed,
            process_index=self.process_index,
            process_count=self.process_count,
            to_float=False,
        )
        if self.held is None:
            return False, pipeline.train_batch(self.primary, step=step, **kw)
        major_steps = self.primary_steps
        epoch, pos = divmod(step, self.steps_per_epoch)
        if pos < major_steps:
            return False, pipeline.train_batch(
                self.primary, step=epoch * major_steps + pos, **kw
            )
        index = epoch * self.held_steps + pos - major_steps
        return True, pipeline.train_batch(self.held, step=index, **kw)


def train_schedule(
    source: Source,
    *,
    batch_size: int,
    seed: int,
    holdout_fraction: float | None = None,
    process_index: int = 0,
    process_count: int = 1,
    what: str = "config.interleaved.holdout_fraction",
) -> TrainSchedule:
    """The schedule of ``source``, interleaved when ``holdout_fraction`` is given.

    Args:
      source: the training source.
      batch_size: the global batch size.
      seed: the training seed (the order of the examples within each part).
      holdout_fraction: the share of ``source`` held out for the secondary
        steps, in ``(0, 1)``; ``None`` for a plain schedule.
      process_index: this process (``jax.process_index()``).
      process_count: the number of processes.
      what: the name of ``holdout_fraction`` in error messages.

    Raises:
      ValueError: ``holdout_fraction`` leaves one part empty.
    """
    if holdout_fraction is None:
        return TrainSchedule(
            source, None, batch_size, seed, process_index, process_count
        )
    order = np.random.default_rng(HOLDOUT_SEED).permutation(len(source))
    n_hold = int(round(holdout_fraction * len(order)))
    if not 0 < n_hold < len(order):
        raise ValueError(
            f"{what} leaves no example on one side of the {len(order)} training "
            f"examples, got {holdout_fraction}."
        )
    major = SubsetSource(source, np.sort(order[n_hold:]))
    held = SubsetSource(source, np.sort(order[:n_hold]))
    return TrainSchedule(major, held, batch_size, seed, process_index, process_count)
