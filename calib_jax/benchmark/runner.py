"""Runs the benchmark grid, cell by cell, resumably.

A cell is one training method at one seed: the trainer's run (which resumes
from its own checkpoints) followed by every post-hoc calibrator on its logits.
A finished cell leaves ``cells/<method>/seed<k>/rows.jsonl`` (written to a
temporary name and renamed, so it exists only complete); a rerun skips it.

Most of a small grid's time is compiles: every cell builds its training and
evaluation functions anew, so the in-memory jit cache never hits across cells.
A local workdir therefore holds JAX's persistent compilation cache
(:func:`compilation_cache`), which the seeds after the first of every method
and every later cell's post-hoc fits hit: the same executables, loaded
instead of compiled, so results are the same to the byte.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

import jax
import numpy as np
from etils import epath
from jax.experimental.compilation_cache import compilation_cache as cc
from ml_collections import ConfigDict

from calib_jax import models
from calib_jax import progress as progress_lib
from calib_jax import _cli, storage, tensorboard
from calib_jax import train as train_lib
from calib_jax.benchmark import evaluate, events, grid, report
from calib_jax.train import workdir as workdir_lib
from calib_jax.train.loop import train_and_evaluate

CONFIG_FILE = "benchmark_config.json"
# The file that marks a training run's workdir (calib_jax.train.workdir.claim).
TRAIN_CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
# Logging and the report's figures may change between runs of one benchmark.
RESUMABLE_KEYS = ("log", "report")
# JAX's persistent compilation cache of a local workdir.
COMPILATION_CACHE = "compilation_cache"


def _reset_cache() -> None:
    """Reopens JAX's compilation cache without its INFO line on stderr."""
    log = logging.getLogger("jax._src.compilation_cache")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        cc.reset_cache()
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def compilation_cache(workdir: epath.Path):
    """JAX's persistent compilation cache in ``workdir/compilation_cache``.

    Every compile of the benchmark is written there (no minimum compile time
    or size) and read back by the cells that compile the same computation:
    on the digits demo the seeds after the first of each method and the
    post-hoc fits of later cells. A deserialised executable is the compiled
    one, so results do not change (the demo's ``results.jsonl`` is the same
    byte for byte with and without it). Left as it is when the workdir is
    remote (a file per compile in an object store would cost more than it
    saves), when ``JAX_COMPILATION_CACHE_DIR``/``jax_compilation_cache_dir``
    names a cache already, or when ``JAX_ENABLE_COMPILATION_CACHE=false``.
    The previous settings are restored on exit.
    """
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    if (
        storage.is_remote(workdir)
        or jax.config.jax_compilation_cache_dir
        or not jax.config.jax_enable_compilation_cache
    ):
        yield
        return
    before = {n: getattr(jax.config, n) for n in names}
    _reset_cache()  # the cache is opened once per process: reopen it here
    values = (str(workdir / COMPILATION_CACHE), 0.0, -1)
    for name, value in zip(names, values, strict=True):
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        _reset_cache()


def check_workdir(config: ConfigDict, workdir: epath.PathLike) -> None:
    """Writes the resolved config, or refuses a workdir of another benchmark.

    :func:`calib_jax.train.workdir.claim` with the benchmark's file.

    Raises:
      ValueError: ``workdir`` is malformed, unreachable, not a directory or
        not writable, or it holds results of a different benchmark config or
        a training run.
    """
    workdir_lib.claim(
        config,
        workdir,
        filename=CONFIG_FILE,
        resumable=RESUMABLE_KEYS,
        loss_fields=("train.loss", "train.interleaved.secondary"),
        holds="results of a different benchmark config",
        foreign={TRAIN_CONFIG_FILE: "a training run"},
    )


def validate(config: ConfigDict, workdir: epath.Path) -> None:
    """Every check that can fail before compute: grid names, train configs, workdir."""
    grid.check_grid(config)
    name = config.train.model.name
    if "mc_dropout" in config.methods and name not in models.DROPOUT_MODELS:
        raise ValueError(
            f"Method mc_dropout needs a model with dropout, but config.train.model."
            f"name is '{name}'; valid: {', '.join(models.DROPOUT_MODELS)}."
        )
    if config.num_bins < 1:
        raise ValueError(f"config.num_bins must be >= 1, got {config.num_bins}.")
    t = config.get("calibration_tests")
    if t is None or "num_samples" not in t:
        raise ValueError(
            "config.calibration_tests.num_samples is missing (resamples of the "
            "ECE consistency test; 0 = none; configs.common.benchmark_base sets it)."
        )
    n = t.num_samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(
            f"config.calibration_tests.num_samples must be an integer >= 0 (0: no "
            f"consistency p-value), got {n!r}."
        )
    b = config.bootstrap
    if b.num_samples < 0:
        raise ValueError(
            f"config.bootstrap.num_samples must be >= 0 (0: no intervals), got "
            f"{b.num_samples}."
        )
    if not 0.0 < b.confidence < 1.0:  # NaN fails too
        raise ValueError(
            f"config.bootstrap.confidence must lie in (0, 1), got {b.confidence}."
        )
    # The trainer's checks of every cell's config (the two-stage method's
    # stage I, the ce run, included).
    methods = [m for m in config.methods if not grid.ensemble_of(m)]
    if "two_stage" in methods and grid.STAGE_ONE not in methods:
        methods.insert(0, grid.STAGE_ONE)
    for method in methods:
        train_lib.validate(grid.train_config(config, method, 0, workdir))
    if tensorboard.enabled(config):
        tensorboard.check_writable(events.root(workdir))
    check_workdir(config, workdir)  # writes config.json: the last check


def _write_rows(path: epath.Path, rows: list[dict]) -> None:
    storage.make_dirs(path.parent)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    storage.write_text(path, text)


def _summary_line(method: str, seed: int, rows: list[dict], seconds: float) -> str:
    def mean(cal, key, clean):
        vals = [
            r[key]
            for r in rows
            if r["calibrator"] == cal and (r["shift"] == "clean") == clean
        ]
        return float(np.mean(vals)) if vals else float("nan")

    text = (
        f"{method:>18s} seed {seed}: acc {100 * mean('none', 'accuracy', True):5.1f}%"
        f"  ECE {100 * mean('none', 'ece', True):5.2f}%"
    )
    if any(r["calibrator"] == "ts:nll" for r in rows):
        text += f"  ECE+TS {100 * mean('ts:nll', 'ece', True):5.2f}%"
    if any(r["shift"] != "clean" for r in rows):
        text += f"  shifted ECE {100 * mean('none', 'ece', False):5.2f}%"
    return text + f"  ({seconds:.0f} s)"


class Preempted(_cli.Stopped):
    """SIGTERM stopped a cell's training after its checkpoint was saved
    (exit status 0, as the trainer's)."""

    status = 0


def ensure_trained(
    config: ConfigDict,
    workdir: epath.Path,
    method: str,
    seed: int,
    *,
    progress: bool = False,
) -> epath.Path:
    """Trains (or resumes) the run of one cell unless it finished; returns its dir.

    The two-stage method first ensures its stage I, the ``ce`` run of the seed.
    ``progress`` shows the training steps and evaluation under the cell bar.

    Raises:
      Preempted: SIGTERM stopped the training (its checkpoint saved; the cell
        is not marked trained, so a rerun resumes it).
    """
    train_dir = grid.train_dir(workdir, method, seed)
    done = train_dir / "TRAINED"
    if not done.exists():
        if method == "two_stage":
            ensure_trained(config, workdir, grid.STAGE_ONE, seed, progress=progress)
        try:
            summary = train_and_evaluate(
                grid.train_config(config, method, seed, workdir),
                train_dir,
                progress=progress,
                progress_level=1,
            )
        except FloatingPointError as e:  # name the cell that diverged
            raise FloatingPointError(f"{method} seed {seed} ({train_dir}): {e}") from e
        if not summary:  # SIGTERM: saved and stopped before the end
            raise Preempted(
                f"SIGTERM: saved {method} seed {seed} in {train_dir} and stopped; "
                "rerun the same command to resume."
            )
        if jax.process_index() == 0:
            done.touch()
    return train_dir


def run_cell(
    config: ConfigDict,
    workdir: epath.Path,
    method: str,
    seed: int,
    *,
    progress: bool = False,
) -> tuple[list[dict], list[dict]]:
    """Trains (or resumes) one cell; returns its result and reliability rows.

    An ``ensemble(<method>)`` cell ``seed`` (its ensemble's number) trains
    none of its own: it ensures the runs of its member seeds
    (:func:`calib_jax.benchmark.grid.member_seeds`) and evaluates the mean of
    their predictions. ``progress`` shows bars (under the cell bar) over the training steps, the
    evaluation sets and the post-hoc fits.
    """
    ood_name = config.train.ood.dataset
    base = grid.ensemble_of(method)
    if base:  # a deep ensemble: its members' runs, no training of its own
        members = [
            ensure_trained(config, workdir, base, s, progress=progress)
            for s in grid.member_seeds(config, seed)
        ]
        logits, mutual = evaluate.ensemble_logits(members, ood_name)
    else:
        train_dir = ensure_trained(config, workdir, method, seed, progress=progress)
        logits = evaluate.load_logits(train_dir, ood_name)
        mutual = evaluate.load_mutual_information(train_dir, ood_name)
    fits = progress_lib.bar(
        len(config.calibrators),
        desc=f"post-hoc {method} seed {seed}",
        unit="fit",
        enabled=progress,
        level=1,
    )

    def fitted(name: str) -> None:
        fits.set_postfix_str(name, refresh=False)
        fits.update(1)

    with fits:
        return evaluate.cell_results(
            logits,
            method=method,
            seed=seed,
            calibrators=tuple(config.calibrators),
            num_bins=int(config.num_bins),
            bootstrap_samples=int(config.bootstrap.num_samples),
            confidence=float(config.bootstrap.confidence),
            test_samples=int(config.calibration_tests.num_samples),
            mutual_information=mutual,
            progress=fitted,
        )


def run(config: ConfigDict, workdir: str | epath.PathLike) -> epath.Path:
    """Runs (or resumes) the whole grid and writes the report.

    Args:
      config: a benchmark config (``configs/benchmark_*.py``).
      workdir: output directory, local or ``gs://``; rerunning the same
        command resumes.

    Returns:
      The path of ``report.md``.

    Raises:
      ValueError: as :func:`validate`, or another benchmark is using
        ``workdir`` (the lock of :func:`calib_jax.train.workdir.lock`; each
        cell's training run locks its own directory under ``cells/``).
    """
    workdir = storage.as_path(workdir, what="--workdir")
    validate(config, workdir)
    with workdir_lib.lock(workdir), compilation_cache(workdir):
        return _run(config, workdir)


def _run(config: ConfigDict, workdir: epath.Path) -> epath.Path:
    todo = grid.cells(config)
    primary = jax.process_index() == 0
    tb = tensorboard.enabled(config) and primary
    bar = progress_lib.bar(len(todo), desc="benchmark", unit="cell", enabled=primary)
    all_rows, all_reliability = [], []
    for method, seed in todo:
        bar.set_postfix_str(f"{method} seed {seed}", refresh=False)
        path = grid.cell_dir(workdir, method, seed) / "rows.jsonl"
        bins_path = path.parent / evaluate.RELIABILITY_FILE
        if path.exists() and bins_path.exists():
            all_rows.extend(storage.read_jsonl(path))
            all_reliability.extend(storage.read_jsonl(bins_path))
            bar.update(1)
            continue
        start = time.perf_counter()
        rows, reliability = run_cell(config, workdir, method, seed, progress=primary)
        if primary:
            _write_rows(bins_path, reliability)  # before rows.jsonl, which ends a cell
            _write_rows(path, rows)
            bar.write(_summary_line(method, seed, rows, time.perf_counter() - start))
            if tb:
                events.write_cell(workdir, method, seed, rows)
        all_rows.extend(rows)
        all_reliability.extend(reliability)
        bar.update(1)
    bar.close()
    if not primary:
        return workdir / report.REPORT_FILE
    _write_rows(workdir / RESULTS_FILE, all_rows)
    _write_rows(workdir / evaluate.RELIABILITY_FILE, all_reliability)
    path = report.write_report(config, workdir, all_rows, all_reliability)
    if tb:
        events.write_figures(workdir, report.figures(path.read_text()))
    return path
