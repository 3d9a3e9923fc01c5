"""Scores a finished (or interrupted) training run without retraining.

:func:`run` restores the newest checkpoint of a run that restores with the
config (read only: the run's directory is never changed), evaluates the
validation and test splits, every shifted test set and the OOD set of the
config through :mod:`calib_jax.train.evaluate` (the trainer's own evaluation),
and writes the metrics, logits and plots under ``out``. With
``from_logits=True`` it scores the logits the run exported instead, with no
checkpoint and no data. With MC dropout (``config.mc_dropout.num_samples > 0``
or ``mc_dropout_samples``) a checkpoint is evaluated by the mean of its
dropout samples, as the trainer does (:func:`calib_jax.train.evaluate.
mc_dropout_step`), and the logits files also hold ``mutual_information``.
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils
from ml_collections import ConfigDict

from calib_jax import data as data_lib
from calib_jax import metrics, plots, storage, tensorboard
from calib_jax.data import cache as cache_lib
from calib_jax.data import corruptions
from calib_jax.progress import Progress
from calib_jax.train import checkpoint, sharded_step, two_stage
from calib_jax.train import evaluate as eval_lib
from calib_jax.train import mesh as mesh_lib

OUT_DIRNAME = "evaluate"
METRICS_JSON = "metrics.json"
METRICS_JSONL = "metrics.jsonl"
LOGITS_DIR = "logits"
PLOTS_DIR = "plots"
# What an evaluation writes under --out (the only paths --overwrite removes).
OUTPUTS = (METRICS_JSON, METRICS_JSONL, LOGITS_DIR, PLOTS_DIR, tensorboard.DIRNAME)
# Fields of the run's config.json that must match --config (the model whose
# checkpoint is restored and the data it was trained on).
_MUST_MATCH = (("model",), ("dataset", "name"), ("two_stage", "enabled"))


def _field(tree, path):
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def check_config(config: ConfigDict, workdir: epath.Path) -> None:
    """ValueError when ``config`` is not the run's (model, dataset, stage II).

    A run without ``config.json`` (exported logits copied elsewhere) is not
    checked.
    """
    path = workdir / "config.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    new = json.loads(config.to_json_best_effort())
    # A run recorded before config.model.dropout_rate existed had none.
    if isinstance(old.get("model"), dict):
        old["model"].setdefault("dropout_rate", 0.0)
    diff = [".".join(p) for p in _MUST_MATCH if _field(old, p) != _field(new, p)]
    if diff:
        raise ValueError(
            f"--config differs from the run's {path} in: {', '.join(diff)}; "
            "pass the config the run was trained with."
        )


def _set_mc_dropout(config, samples, seed, from_logits: bool) -> None:
    """Writes ``--mc_dropout_samples``/``--mc_dropout_seed`` into ``config``.

    Raises:
      ValueError: a negative or non-int count or seed, or samples with
        ``--from_logits`` (exported logits cannot be resampled).
    """
    if samples is None and seed is None:
        return
    if config.get("mc_dropout") is None:
        raise ValueError(
            "--mc_dropout_samples/--mc_dropout_seed: --config has no mc_dropout "
            "field; build it on calib_jax.configs.common.base()."
        )
    for flag, value in (("--mc_dropout_samples", samples), ("--mc_dropout_seed", seed)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ValueError(f"{flag} must be an int >= 0, got {value!r}.")
    if samples and from_logits:
        raise ValueError(
            f"--mc_dropout_samples={samples} needs the checkpoint: "
            "--from_logits scores the logits the run exported (drop one)."
        )
    if samples is not None:
        config.mc_dropout.num_samples = samples
    if seed is not None:
        config.mc_dropout.seed = seed


def _has_logits(workdir: epath.Path) -> bool:
    return (workdir / "logits").is_dir() and any((workdir / "logits").glob("*.npz"))


def check_out(workdir: epath.Path, out: epath.Path, overwrite: bool) -> None:
    """ValueError for an ``out`` that would overwrite the run or an evaluation."""
    run_dir, target = storage.absolute(workdir), storage.absolute(out)

    def within(root: epath.Path) -> bool:
        return target == root or str(target).startswith(f"{root}/")

    if (
        target == run_dir
        or within(run_dir / "logits")
        or within(run_dir / "checkpoints")
    ):
        raise ValueError(
            f"--out {out} is the run's own directory (or its logits or "
            "checkpoints); choose another --out."
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory.")
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not overwrite:
        raise ValueError(
            f"--out {out} already holds an evaluation ({', '.join(found)}); pass "
            "--overwrite to replace it, or choose another --out."
        )


def _exported_keys(config: ConfigDict, logits_dir: epath.Path) -> list[str]:
    """The exported sets that ``config`` selects, in the trainer's order."""
    keys = [k for k, s in (("val", config.dataset.val_split), ("test", "x")) if s]
    if not config.dataset.test_split:
        return keys[:1] if config.dataset.val_split else []
    spec = config.shifts.corruptions
    if spec.strip() not in ("none", ""):
        severities = eval_lib.check_severities(config)
        exported = eval_lib.exported_shifts(logits_dir)
        published = bool(config.shifts.dataset)
        known = (
            sorted({c for c, _ in exported})
            if published
            else list(corruptions.CORRUPTIONS)
        )
        names = eval_lib.select_corruptions(spec, known, published=published)
        for name in names:
            for severity in severities:
                if published and (name, severity) not in exported:
                    continue  # the trainer skips sets absent from the data, too
                keys.append(f"shift/{name}/{severity}")
    if config.get("ood") is not None and config.ood.dataset:
        keys.append(eval_lib.OOD_KEY)
    return keys


def _last_step(workdir: epath.Path) -> int | None:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = storage.read_jsonl(path)
    return int(rows[-1]["step"]) if rows else None


def _from_checkpoint(config: ConfigDict, workdir: epath.Path, progress: bool):
    """``(results, logits, extras, rows, step)`` of the newest checkpoint that
    restores (``logits``: this process's rows of each set; ``extras``: MC
    dropout's per-row fields and the rows' positions; ``rows``: every set's
    top-label rows, whole on every process)."""
    dataset = data_lib.get_dataset(
        config.dataset.name, data_dir=config.dataset.data_dir or None
    )
    if not config.eval_batch_size > 0:
        raise ValueError(
            f"config.eval_batch_size must be a positive int, got {config.eval_batch_size}."
        )
    mesh = mesh_lib.data_mesh()
    mesh_lib.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")
    shifts = eval_lib.resolve_shifts(config, dataset)
    ood = eval_lib.resolve_ood(config, dataset)
    if config.two_stage.enabled:
        stage, model = two_stage.build_stage_two(config, dataset), None
    else:
        stage, model = None, sharded_step.make_model(config, dataset.num_classes)
    mc_dropout = eval_lib.check_mc_dropout(config, model, dataset) > 0
    # Only the eval step and the state's structure are used; neither depends
    # on the schedule's length.
    steps = sharded_step.build_sharded_step(
        config, dataset, mesh, max(int(config.num_steps), 1), model=model, stage=stage
    )
    eval_step = (
        eval_lib.mc_dropout_step(config, model, dataset, steps)
        if mc_dropout
        else steps.eval
    )
    state, step = checkpoint.restore_read_only(workdir, steps.abstract_state)
    decoded = cache_lib.SplitCache(
        memory_bytes=config.input.memory_gb * 2**30,
        cache_dir=config.input.cache_dir or None,
        workers=config.input.decode_workers,
    )

    def put(batch):
        return mesh_lib.put_batch(batch, steps.batch_sharding)

    sets = eval_lib.eval_sets(config, dataset, shifts, ood)
    total = sum(len(s.source) for s in sets)
    show = progress and jax.process_index() == 0
    extras: dict = {}
    rows: dict = {}
    with Progress(total, enabled=show) as bar:
        results, logits = eval_lib.evaluate(
            config,
            sets,
            eval_step,
            state,
            put,
            decoded,
            progress=bar,
            extras=extras,
            rows=rows,
        )
    return results, logits, extras, rows, step


def _top_label(logits: dict, rows: dict | None, key: str):
    """``(scores, labels)`` for a reliability diagram of set ``key``: its
    top-label rows when the evaluation kept them (the whole set; a process's
    ``logits`` are its own rows only), else the softmax of its logits."""
    if rows and key in rows:
        r = rows[key]
        return metrics.TopLabelRows(r.confidence, r.correct), None
    z, y = logits[key]
    return jax.nn.softmax(np.asarray(z, np.float32), axis=-1), y


def _plots(out: epath.Path, logits: dict, results: dict, rows: dict | None) -> None:
    directory = out / PLOTS_DIR
    storage.make_dirs(directory)
    for key in ("val", "test"):
        if key in logits:
            scores, labels = _top_label(logits, rows, key)
            plots.reliability_diagram(
                scores,
                labels,
                num_bins=15,
                title=f"{key}: accuracy {100 * results[f'{key}/accuracy']:.1f}%, "
                f"ECE {100 * results[f'{key}/ece']:.2f}%",
                path=directory / f"reliability_{key}.png",
            )
    shifted = [k for k in logits if k.startswith("shift/")]
    if shifted and "test" in logits:
        curves: dict[str, dict[int, list[float]]] = {}
        for key in shifted:
            _, name, severity = key.split("/")
            curve = curves.setdefault(name, {0: [results["test/ece"]]})
            curve[int(severity)] = [results[f"{key}/ece"]]
        plots.ece_vs_severity(
            curves,
            metric_name="ECE (15 equal-width bins, l1)",
            error=None,
            title="ECE vs shift severity (severity 0: clean test)",
            path=directory / "ece_vs_severity.png",
        )


def _write_events(tb, results: dict, logits: dict, rows, step: int | None) -> None:
    """Scalars (every metric) and reliability diagrams to TensorBoard."""
    step = step or 0
    with tb:
        tb.scalars(step, results)
        for key in ("val", "test"):
            if key not in logits:
                continue
            if rows and key in rows:
                scores, _ = _top_label(logits, rows, key)
                image = plots.reliability_diagram(scores, None, title=key)
                tb.image(f"{key}/reliability", step, image)
            else:
                z, y = logits[key]
                tb.reliability(f"{key}/reliability", step, z, y, title=key)


def _prepare(out, overwrite: bool) -> None:
    """Process 0 clears the outputs of an earlier evaluation (``overwrite``)
    and makes ``out``; every process waits for it."""
    if jax.process_index() == 0:
        if overwrite:
            for name in OUTPUTS:
                path = out / name
                if path.is_dir():
                    path.rmtree()
                elif path.exists():
                    path.unlink()
        storage.make_dirs(out)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("calib_jax.evaluate: outputs cleared")


def _write(out, workdir, results, logits, extras, rows, step, *, source, ood_name, tb):
    """Every process exports its own rows' logits (``source='checkpoint'``);
    process 0 writes the metrics, the plots and the TensorBoard events."""
    if source == "checkpoint":
        eval_lib.export_logits(out / LOGITS_DIR, logits, ood_name, extras=extras)
    if jax.process_index() != 0:
        return
    row = {"step": step, "time": round(time.time(), 3)} if step is not None else {}
    row.update({k: float(v) for k, v in results.items()})
    storage.write_text(out / METRICS_JSONL, json.dumps(row) + "\n")
    summary = {
        "workdir": str(workdir),
        "source": source,
        "step": step,
        "metrics": results,
    }
    storage.write_text(out / METRICS_JSON, json.dumps(summary, indent=2) + "\n")
    _plots(out, logits, results, rows)
    _write_events(tb, results, logits, rows, step)


def run(
    config: ConfigDict,
    workdir: str | epath.PathLike,
    *,
    out: str | epath.PathLike | None = None,
    from_logits: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    mc_dropout_samples: int | None = None,
    mc_dropout_seed: int | None = None,
) -> tuple[dict[str, float], epath.Path]:
    """Evaluates the run in ``workdir`` as ``config`` says, without retraining.

    Args:
      config: the run's trainer config, with any evaluation changes
        (``shifts``, ``ood``, ``eval_batch_size``, data dirs).
      workdir: the training run (local or ``gs://``).
      out: output directory (default ``<workdir>/evaluate``).
      from_logits: score the logits the run exported (``<workdir>/logits``)
        instead of restoring a checkpoint: the sets the config selects must
        have been exported.
      overwrite: replace an earlier evaluation in ``out``.
      progress: show progress over the evaluated images.
      mc_dropout_samples: MC dropout (Gal and Ghahramani 2016): this many
        test-time dropout samples per row (``config.mc_dropout.num_samples``;
        None keeps the config's, 0 turns it off). The metrics and logits are
        of the mean of the samples' probabilities, and each logits file also
        holds the per-row ``mutual_information``; the model must have
        dropout (``config.model.dropout_rate > 0``). Needs a checkpoint.
      mc_dropout_seed: the samples' seed (``config.mc_dropout.seed``; None
        keeps the config's).

    Returns:
      ``(metrics, out)``: the metrics under the trainer's keys (``val/...``,
      ``test/...``, ``shift/<corruption>/<severity>/...``,
      ``shift/mean/...``, ``ood/...``; with MC dropout also
      ``<set>/mutual_information``, the mean over the set's rows) and the
      output directory, which holds
      ``metrics.jsonl`` (one row in the trainer's format), ``metrics.json``,
      ``logits/`` (the trainer's file names; not with ``from_logits``),
      ``plots/`` and, with ``config.log.tensorboard``, ``tensorboard/`` (every
      metric as a scalar at the run's step, the val and test reliability
      diagrams as images).

    Raises:
      ValueError: a workdir with neither checkpoints nor logits, a config of
        another model, an existing evaluation without ``overwrite``, MC
        dropout samples with ``from_logits`` or of a model without dropout,
        or any bad name or missing data of the config (one line).
    """
    _set_mc_dropout(config, mc_dropout_samples, mc_dropout_seed, from_logits)
    workdir = storage.as_path(workdir, what="--workdir")
    storage.check_reachable(workdir, what="--workdir")
    if not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} does not exist or is not a directory.")
    out = storage.as_path(out, what="--out") if out else workdir / OUT_DIRNAME
    has_checkpoint = bool(checkpoint.checkpoint_steps(workdir))
    has_logits = _has_logits(workdir)
    if not has_checkpoint and not has_logits:
        raise ValueError(
            f"--workdir {workdir} holds neither checkpoints nor exported logits; "
            "is it a training run's workdir?"
        )
    if from_logits and not has_logits:
        raise ValueError(
            f"--from_logits: {workdir / 'logits'} holds no exported logits (the "
            "run did not finish); evaluate its checkpoint without --from_logits."
        )
    if not from_logits and not has_checkpoint:
        raise ValueError(
            f"{workdir} holds no checkpoint; score its exported logits with "
            "--from_logits."
        )
    check_config(config, workdir)
    check_out(workdir, out, overwrite)
    # <out>/tensorboard, or <config.log.tensorboard_dir>/evaluate; checked now.
    tb = tensorboard.from_config(config, out, subdir=OUT_DIRNAME)
    ood_name = config.ood.dataset if config.get("ood") is not None else ""
    if from_logits:
        keys = _exported_keys(config, workdir / "logits")
        logits = eval_lib.read_logits(workdir / "logits", keys, ood_name)
        # A run with MC dropout exported each set's mutual information too.
        extras = eval_lib.read_extras(workdir / "logits", keys, ood_name)
        # Batch by batch as the run scored them: its numbers bit for bit.
        batch = eval_lib.run_eval_batch_size(workdir, config.eval_batch_size)
        scored = eval_lib.score(logits, batch_size=batch)
        results = dict(scored, **eval_lib.mc_metrics(extras))
        step, rows = _last_step(workdir), None
    else:
        results, logits, extras, rows, step = _from_checkpoint(
            config, workdir, progress
        )
    _prepare(out, overwrite)
    _write(
        out,
        workdir,
        results,
        logits,
        extras,
        rows,
        step,
        source="logits" if from_logits else "checkpoint",
        ood_name=ood_name,
        tb=tb,
    )
    return results, out
