"""The benchmark grid: training methods x post-hoc calibrators x seeds.

A *method* turns the benchmark's base training config into the config of one
training run. Most methods only set the loss terms (``configs.common``'s
named objectives); two are training procedures:

- ``interleaved_sb_ece``: the soft-calibration paper's App. B (each epoch
  trains cross-entropy on 90% of the training set, then SB-ECE alone on the
  held-out 10%);
- ``two_stage``: MaC-Cal stage II (masked retraining of a new bottleneck head)
  on the frozen features of the ``ce`` run of the same seed, which is its
  stage I;
- ``mc_dropout``: the ``ce`` objective on the model with dropout
  (``config.mc_dropout.dropout_rate``), evaluated by Monte Carlo dropout
  (Gal & Ghahramani 2016): the exported logits of every evaluation set are the
  log of the mean softmax probabilities of ``config.mc_dropout.num_samples``
  dropout samples, and the mutual information of the samples is kept per row.

``ensemble(<method>)`` (e.g. ``ensemble(ce)``) is a deep ensemble
(Lakshminarayanan et al. 2017) of the seed runs of ``<method>``, with no
training of its own: its logits are the log of the mean of its members'
softmax probabilities. ``config.ensemble`` groups seeds into disjoint
ensembles: ensemble ``g`` (``g = 0 .. num_groups - 1``, its ``seed`` in the
rows, so that it pairs with seed ``g`` of every other method) averages the
runs of ``<method>`` with seeds ``g * size .. (g + 1) * size - 1``. Runs of
member seeds outside ``config.seeds`` are trained for the ensembles only
(``config.ensemble.extra_runs``; they give no rows of ``<method>``, whose rows
stay those of ``config.seeds``); with ``extra_runs=False`` every member seed
must be one of ``config.seeds``.

A *calibrator* is ``'none'`` or a name of :data:`calib_jax.posthoc.CALIBRATORS`
(``'ts:<objective>'`` for temperature scaling by an objective). The
binary-only calibrators (``'platt'``, ``'beta'``; :data:`calib_jax.posthoc.
BINARY_ONLY`) are defined for K = 2: on a dataset with K > 2 classes (digits,
CIFAR) they are skipped, with a note in the report, instead of failing.
"""

from __future__ import annotations

import copy
import re

from etils import epath
from ml_collections import ConfigDict

from calib_jax import objectives
from calib_jax.objectives import OBJECTIVES

PROCEDURES = ("interleaved_sb_ece", "two_stage", "mc_dropout")
METHODS: tuple[str, ...] = (*OBJECTIVES, *PROCEDURES)
# The stage-I run of the two-stage method.
STAGE_ONE = "ce"
_ENSEMBLE = re.compile(r"ensemble\((.+)\)")


def ensemble_of(method: str) -> str | None:
    """The member method of ``'ensemble(<method>)'``; None for another name."""
    m = _ENSEMBLE.fullmatch(method)
    return m.group(1) if m else None


def ensemble_name(method: str) -> str:
    """``'ensemble(<method>)'``: the deep-ensemble method of ``method``'s runs."""
    return f"ensemble({method})"


def member_seeds(config: ConfigDict, group: int) -> list[int]:
    """The member seeds of ensemble ``group``: ``group * size .. (group + 1) * size - 1``."""
    size = int(config.ensemble.size)
    return list(range(group * size, (group + 1) * size))


def ensemble_groups(config: ConfigDict) -> list[int]:
    """The ensembles of every ``ensemble(...)`` method: ``0 .. num_groups - 1``."""
    return list(range(int(config.ensemble.num_groups)))


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
    bad = [m for m in config.methods if m not in METHODS and not ensemble_of(m)]
    if bad:
        raise _unknown(
            "method(s)", bad, (*METHODS, "ensemble(<method>) of a method of the grid")
        )
    _check_ensembles(config)
    if "mc_dropout" in config.methods:
        _check_mc_dropout(config)
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


def _check_ensembles(config: ConfigDict) -> None:
    """One-line ``ValueError``s for ``ensemble(...)`` methods and ``config.ensemble``."""
    ensembles = [m for m in config.methods if ensemble_of(m)]
    if not ensembles:
        return
    singles = [m for m in config.methods if not ensemble_of(m)]
    for name in ensembles:
        base = ensemble_of(name)
        if base not in singles:
            choices = ", ".join(ensemble_name(m) for m in singles) or "none"
            raise ValueError(
                f"config.methods has {name}, but {base!r} is not a method of the "
                f"grid (config.methods); valid ensembles: {choices}."
            )
    e = config.get("ensemble")
    fields = ("size", "num_groups", "extra_runs")
    if e is None or any(f not in e for f in fields):
        raise ValueError(
            f"config.methods has {ensembles[0]}, but config.ensemble lacks a field "
            f"of {', '.join(fields)} (configs.common.benchmark_base sets them)."
        )
    for field, low in (("size", 2), ("num_groups", 1)):
        value = e[field]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                f"config.ensemble.{field} must be an integer >= {low}, got {value!r}."
            )
    if type(e.extra_runs) is not bool:  # 1 and 'yes' are not flags
        raise ValueError(
            f"config.ensemble.extra_runs must be True or False, got {e.extra_runs!r}."
        )
    needed = e.size * e.num_groups
    if not e.extra_runs and not set(range(needed)) <= set(config.seeds):
        raise ValueError(
            f"config.ensemble: {e.num_groups} ensemble(s) of size {e.size} need the "
            f"runs of seeds 0..{needed - 1}, but config.seeds is "
            f"{list(config.seeds)} and config.ensemble.extra_runs is False; valid: "
            f"size x num_groups <= the seeds 0, 1, ... of config.seeds, or "
            "extra_runs=True."
        )


def _check_mc_dropout(config: ConfigDict) -> None:
    """One-line ``ValueError``s for ``config.mc_dropout`` of method ``mc_dropout``."""
    m = config.get("mc_dropout")
    if m is None or any(f not in m for f in ("dropout_rate", "num_samples", "seed")):
        raise ValueError(
            "config.methods has mc_dropout, but config.mc_dropout lacks a field of "
            "dropout_rate, num_samples, seed (configs.common.benchmark_base sets "
            "them)."
        )
    rate, num = m.dropout_rate, m.num_samples
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
        raise ValueError(
            f"config.mc_dropout.dropout_rate must lie in (0, 1) for method "
            f"mc_dropout (a model without dropout has no samples), got {rate!r}."
        )
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(
            f"config.mc_dropout.num_samples must be an integer >= 1 for method "
            f"mc_dropout, got {num!r}."
        )


def cells(config: ConfigDict) -> list[tuple[str, int]]:
    """``(method, seed)`` cells in run order (stage I before stage II).

    An ensemble's cells come right after its member method's cells, one per
    ensemble (:func:`ensemble_groups`); it trains any member run that is not
    one of them (:func:`member_seeds`) before it is evaluated.
    """
    methods = list(config.methods)
    if "two_stage" in methods and STAGE_ONE in methods:
        methods.remove("two_stage")
        methods.insert(methods.index(STAGE_ONE) + 1, "two_stage")
    for name in [m for m in methods if ensemble_of(m)]:
        base = ensemble_of(name)
        if base in methods:
            methods.remove(name)
            methods.insert(methods.index(base) + 1, name)
    return [
        (m, s)
        for m in methods
        for s in (ensemble_groups(config) if ensemble_of(m) else config.seeds)
    ]


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
    elif method == "mc_dropout":
        m = config.mc_dropout
        c.loss = objectives.loss_config(OBJECTIVES["ce"])
        if "dropout_rate" in c.model:
            c.model.dropout_rate = float(m.dropout_rate)
        else:  # a model option (calib_jax.models.from_config)
            c.model.kwargs.dropout_rate = float(m.dropout_rate)
        c.mc_dropout.num_samples = int(m.num_samples)
        c.mc_dropout.seed = int(m.seed)
    else:
        raise _unknown("method", [method], METHODS)
    if config.get("log") is not None and config.log.get("tensorboard", False):
        c.log.tensorboard = True
    c.lock()
    return c


def cell_dir(workdir: epath.Path, method: str, seed: int) -> epath.Path:
    """Where a cell keeps its training run and its result rows."""
    return workdir / "cells" / method / f"seed{seed}"


def train_dir(workdir: epath.PathLike, method: str, seed: int) -> epath.Path:
    """The trainer's workdir of a cell (checkpoints, metrics, logits)."""
    return cell_dir(workdir, method, seed) / "train"
