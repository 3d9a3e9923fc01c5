"""The benchmark grid: training methods x post-hoc calibrators x seeds.

A *method* turns the benchmark's base training config into the config of one
training run. Most methods only set the loss terms (``configs.common``'s
named objectives); two are training procedures:

- ``interleaved_sb_ece``: the soft-calibration paper's App. B (each epoch
  trains cross-entropy on 90% of the training set, then SB-ECE alone on the
  held-out 10%);
- ``two_stage``: MaC-Cal stage II (masked retraining of a new bottleneck head)
  on the frozen features of the ``ce`` run of the same seed, which is its
  stage I.

A *calibrator* is ``'none'`` or a name of :data:`calib_jax.posthoc.CALIBRATORS`
(``'ts:<objective>'`` for temperature scaling by an objective). The
binary-only calibrators (``'platt'``, ``'beta'``; :data:`calib_jax.posthoc.
BINARY_ONLY`) are defined for K = 2: on a dataset with K > 2 classes (digits,
CIFAR) they are skipped, with a note in the report, instead of failing.
"""

from __future__ import annotations

import copy

from etils import epath
from ml_collections import ConfigDict

from calib_jax import objectives, storage
from calib_jax.objectives import OBJECTIVES

PROCEDURES = ("interleaved_sb_ece", "two_stage")
METHODS: tuple[str, ...] = (*OBJECTIVES, *PROCEDURES)
# The stage-I run of the two-stage method.
STAGE_ONE = "ce"

CALIBRATORS: tuple[str, ...] = (
    "none",
    "ts:nll",
    "ts:sb_ece",
    "ts:hb_ece",
    "ets",
    "pts",
    "cts",
    "dirichlet",
    "histogram_binning",
    "isotonic",
    "platt",
    "beta",
    "ts+classwise",
    "ets+classwise",
    "pts+classwise",
    "cts+classwise",
)


def applicable(calibrators, num_classes: int) -> tuple[str, ...]:
    """The calibrators that apply to ``num_classes`` classes (binary-only ones
    need K = 2)."""
    from calib_jax import posthoc  # JAX: imported at use, the grid's names stay light

    return tuple(
        c for c in calibrators if num_classes == 2 or c not in posthoc.BINARY_ONLY
    )


def _unknown(kind: str, bad: list[str], known) -> ValueError:
    return ValueError(
        f"Unknown {kind} {', '.join(map(repr, bad))} in the benchmark config. "
        f"Valid: {', '.join(known)}."
    )


def check_grid(config: ConfigDict) -> None:
    """Raises ``ValueError`` (one line) for an empty grid or unknown names."""
    for field in ("methods", "calibrators", "seeds"):
        if not tuple(config[field]):
            raise ValueError(
                f"The benchmark grid is empty: config.{field} has no entries."
            )
    bad = [m for m in config.methods if m not in METHODS]
    if bad:
        raise _unknown("method(s)", bad, METHODS)
    from calib_jax import posthoc  # JAX: imported at use, the grid's names stay light

    bad = [c for c in config.calibrators if c != "none"]
    unknown = []
    for name in bad:
        try:
            posthoc.get_calibrator(name)
        except (TypeError, ValueError):
            unknown.append(name)
    if unknown:
        raise _unknown("calibrator(s)", unknown, CALIBRATORS)
    for group in ("methods", "calibrators", "seeds"):
        values = list(config[group])
        if len(set(values)) != len(values):
            raise ValueError(f"config.{group} lists an entry twice: {values}.")
    if any(not isinstance(s, int) or s < 0 for s in config.seeds):
        raise ValueError(
            f"config.seeds must be non-negative integers, got {list(config.seeds)}."
        )


def cells(config: ConfigDict) -> list[tuple[str, int]]:
    """``(method, seed)`` training cells in run order (stage I before stage II)."""
    methods = list(config.methods)
    if "two_stage" in methods and STAGE_ONE in methods:
        methods.remove("two_stage")
        methods.insert(methods.index(STAGE_ONE) + 1, "two_stage")
    return [(m, s) for m in methods for s in config.seeds]


def train_config(
    config: ConfigDict, method: str, seed: int, workdir: epath.PathLike
) -> ConfigDict:
    """The trainer config of one cell; ``workdir`` is the benchmark's.

    Args:
      config: the benchmark config (``config.train`` is the base run).
      method: a name of :data:`METHODS`.
      seed: the training seed.
      workdir: the benchmark's workdir (stage II reads its stage-I run there).
    """
    c = copy.deepcopy(config.train)
    c.unlock()
    c.seed = int(seed)
    if method in OBJECTIVES:
        c.loss = objectives.loss_config(OBJECTIVES[method])
    elif method == "interleaved_sb_ece":
        c.loss = objectives.loss_config(OBJECTIVES["ce"])
        c.interleaved.enabled = True
        c.interleaved.secondary = objectives.loss_config(
            (dict(name="sb_ece", weight=1.0),), "interleaved.secondary"
        )
    elif method == "two_stage":
        c.loss = objectives.loss_config(OBJECTIVES["ce"])
        c.update(copy.deepcopy(config.two_stage).to_dict())
        c.two_stage.enabled = True
        c.two_stage.stage1_workdir = str(train_dir(workdir, STAGE_ONE, seed))
    else:
        raise _unknown("method", [method], METHODS)
    if config.get("log") is not None and config.log.get("tensorboard", False):
        c.log.tensorboard = True
    c.lock()
    return c


def cell_dir(workdir: epath.PathLike, method: str, seed: int) -> epath.Path:
    """Where a cell keeps its training run and its result rows."""
    return storage.as_path(workdir) / "cells" / method / f"seed{seed}"


def train_dir(workdir: epath.PathLike, method: str, seed: int) -> epath.Path:
    """The trainer's workdir of a cell (checkpoints, metrics, logits)."""
    return cell_dir(workdir, method, seed) / "train"
