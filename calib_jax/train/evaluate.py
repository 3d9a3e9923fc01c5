"""Evaluation of a trained state: shift sets, logits, metrics and their export.

One place for the evaluation that the trainer runs at the end of a run (and
every ``config.eval_every`` steps) and that ``python -m calib_jax.evaluate``
runs on a restored checkpoint or on exported logits:

- :func:`resolve_shifts` and :func:`resolve_ood` turn ``config.shifts`` and
  ``config.ood`` into the shifted test sets and the OOD set;
- :func:`eval_sets` lists every set in a fixed order (``val``, ``test``, each
  shift, ``ood``) and :func:`collect` scores their batches, padded and masked,
  never dropping a remainder, where the logits are: per-row values and
  class-wise sums on the devices (:mod:`calib_jax.train.scoring`), gathered
  across processes as ``O(N)`` rows, never as ``[N, K]`` logits;
- :func:`score_sets` turns them into the metrics (``<set>/<metric>``,
  ``shift/mean/<metric>``, ``ood/<metric>``), and :func:`score` computes the
  same from logits (exported ones): from whole arrays, the row metrics bit
  for bit and the class-wise ECE to float32 rounding; batch by batch with the
  run's eval batch size (:func:`run_eval_batch_size`), every value bit for bit;
- :func:`export_logits` and :func:`read_logits` (of
  :mod:`calib_jax.train.logit_files`) write and read ``<dir>/<set>.npz`` (one
  process) or each process's shard of it, ``<dir>/<set>.process-<i>-of-<n>.npz``;
- :func:`evaluator` puts these together into the trainer's
  ``evaluate(state, export=..., progress=...)``;
- with ``config.mc_dropout.num_samples > 0``, :func:`mc_dropout_step` is the
  eval step: the logits of every set are MC dropout's (the log of the mean of
  the samples' probabilities) and each set also gets the per-row
  ``mutual_information`` (exported beside the logits, its mean in the
  metrics).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zlib
from collections.abc import Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from ml_collections import ConfigDict

from calib_jax import data as data_lib
from calib_jax import metrics, models
from calib_jax import progress as progress_lib
from calib_jax.data import augment as augment_lib
from calib_jax.data import corruptions, pipeline
from calib_jax.data import prefetch as prefetch_lib
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import scoring, sharded_step

# The exported logits' files, part of this module's API (the trainer's and
# python -m calib_jax.evaluate's export and reads).
from calib_jax.train.logit_files import (  # noqa: F401
    MUTUAL_INFORMATION,
    OOD_KEY,
    ROW_INDEX,
    export_logits,
    exported_shifts,
    logits_file,
    read_extras,
    read_logits,
    shard_file,
)
from calib_jax.train.state import variables as state_variables

SPLIT_METRICS = metrics.SPLIT_METRICS
# ood/<name>: the test split (positive) against the OOD set by the maximum
# softmax probability.
OOD_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")
SHIFT_SEED = 10_000


@dataclasses.dataclass
class SetResult:
    """One evaluated set: its rows from every process, its logits from this one.

    Attributes:
      rows: the whole set's per-row values (:class:`scoring.SetRows`), the
        same on every process.
      stats: the class-wise binned sums (None for the OOD set).
      logits: float32 ``[n, K]``, this process's rows of the set (None when
        not kept); the whole set with one process.
      labels: int32 ``[n]``, their labels.
      index: int64 ``[n]``, their positions in the set.
      fields: this process's rows of the eval step's other per-row fields
        (MC dropout's ``mutual_information``).
    """

    rows: scoring.SetRows
    stats: metrics.BinnedStats | None
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None
    index: np.ndarray | None = None
    fields: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def collect_set(
    eval_step: Callable,
    state,
    batches: Iterable[dict],
    transform: Callable[[jax.Array, int], jax.Array] | None = None,
    *,
    num_rows: int,
    split: bool = True,
    mc_tag: int | None = None,
    keep_logits: bool = False,
) -> SetResult:
    """Runs ``eval_step`` over every batch of a set and scores it on the devices.

    Each batch's logits stay where they were computed: their per-row values
    and class-wise sums are accumulated on the devices
    (:class:`scoring.SetScorer`) and gathered across processes once, as
    ``[B]`` rows; with ``keep_logits`` this process copies its own rows of
    the logits to the host (what it exports), and no other process's.

    Args:
      eval_step: jitted ``(state, images) -> logits`` over the data mesh;
        with ``mc_tag``, :func:`mc_dropout_step`'s ``(state, images, tag,
        first_row) -> {'logits', 'mutual_information'}``.
      state: the train state.
      batches: padded global batches with ``image``, ``label``, ``mask``.
      transform: optional ``(images, batch_index) -> images`` on device (a
        corruption for shifted evaluation).
      num_rows: the set's rows (:func:`scoring.block_rows`).
      split: score the split metrics (False for the OOD set).
      mc_tag: the set's tag for :func:`mc_dropout_step` (:func:`mc_set_tag`);
        None for a plain eval step.
      keep_logits: keep this process's rows of the logits.
    """
    scorer = scoring.SetScorer(num_rows, split=split)
    local: dict[str, list[np.ndarray]] = {}
    for i, batch in enumerate(batches):
        images = batch["image"] if transform is None else transform(batch["image"], i)
        if mc_tag is None:
            out = {"logits": eval_step(state, images)}
        else:  # rows are numbered through the set: batch i starts at i * B
            first_row = np.int32(i * images.shape[0])
            out = eval_step(state, images, np.int32(mc_tag), first_row)
        fields = {name: v for name, v in out.items() if name != "logits"}
        scorer.add(out["logits"], batch["label"], batch["mask"], **fields)
        if keep_logits:
            mask, index = scoring.local_rows(batch["mask"])
            for name, x in dict(out, label=batch["label"]).items():
                local.setdefault(name, []).append(scoring.local_rows(x)[0][mask])
            local.setdefault("index", []).append(index[mask] + i * images.shape[0])
    rows, stats = scorer.finish()
    if not keep_logits:
        return SetResult(rows, stats)
    kept = {name: np.concatenate(v) for name, v in local.items()}
    return SetResult(
        rows,
        stats,
        logits=kept.pop("logits"),
        labels=kept.pop("label").astype(np.int32),
        index=kept.pop("index").astype(np.int64),
        fields=kept,
    )


def split_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, NLL, ECE (15 equal-width bins, l1), adaptive and classwise ECE, Brier.

    ``classwise_ece`` is :meth:`calib_jax.metrics.BinnedStats.compute` of the
    class-wise statistics with exact confidence sums (``exact_sums=True``),
    so scoring a run batch by batch (:mod:`calib_jax.train.scoring`) gives
    it bit for bit; the others are :func:`calib_jax.metrics.summary`'s.
    """
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    labels = jnp.asarray(labels)
    names = tuple(n for n in SPLIT_METRICS if n != "classwise_ece")
    values = metrics.summary(probs, labels, names=names)
    values["classwise_ece"] = scoring.classwise_stats(probs, labels).compute(1)
    return {name: float(values[name]) for name in SPLIT_METRICS}


def ood_metrics(test_logits: np.ndarray, ood_logits: np.ndarray) -> dict[str, float]:
    """:data:`OOD_METRICS` of the test logits (positive) against OOD logits.

    The score is the maximum softmax probability (Hendrycks and Gimpel 2017):
    ``auroc`` (:func:`calib_jax.metrics.ood_auroc`), ``aupr_in`` and
    ``aupr_out`` (:func:`calib_jax.metrics.ood_aupr` with the test or the
    OOD set as the positive class) and ``fpr_at_95_tpr``.
    """

    def msp(z):
        return jnp.max(jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1), axis=-1)

    s_in, s_out = msp(test_logits), msp(ood_logits)
    return {
        "auroc": float(metrics.ood_auroc(s_in, s_out)),
        "aupr_in": float(metrics.ood_aupr(s_in, s_out, positive="in")),
        "aupr_out": float(metrics.ood_aupr(s_in, s_out, positive="out")),
        "fpr_at_95_tpr": float(metrics.fpr_at_95_tpr(s_in, s_out)),
    }


# ---- shift and OOD sets ------------------------------------------------------------


def select_corruptions(spec: str, known: list[str], *, published: bool) -> list[str]:
    """The corruption names that ``config.shifts.corruptions`` selects, in order.

    Args:
      spec: ``'none'``/``''`` (no shift), ``'all'`` (every name of ``known``,
        in its order), ``'standard15'`` (the 15 corruptions of Hendrycks and
        Dietterich that papers average over, in their order, each under the
        name ``known`` uses: :data:`calib_jax.data.STANDARD15` and
        :data:`calib_jax.data.CORRUPTION_ALIASES`) or comma-separated names.
      known: the available names (JAX corruptions, or the published files).
      published: whether ``known`` are a published set's files; there
        ``'standard15'`` needs all 15, while the JAX corruptions give those of
        the 15 they implement (8).

    Raises:
      ValueError: an unknown name, or a published set missing some of the 15.
    """
    spec = spec.strip()
    if spec in ("none", ""):
        return []
    if spec == "all":
        return list(known)
    if spec == "standard15":
        names, missing = [], []
        for name in data_lib.STANDARD15:
            found = [
                n
                for n in (name, *data_lib.CORRUPTION_ALIASES.get(name, ()))
                if n in known
            ]
            (names if found else missing).append(found[0] if found else name)
        if published and missing:
            raise ValueError(
                f"config.shifts.corruptions='standard15' needs all 15 corruptions; "
                f"missing: {', '.join(missing)} (found {len(names)} of 15). Use "
                "'all' or list the corruptions present."
            )
        return names
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        where = "in the published set" if published else "among the JAX corruptions"
        raise ValueError(
            f"Unknown corruption(s) {', '.join(unknown)} {where}. Valid: "
            f"{', '.join(known)}, or a preset: "
            f"{', '.join(data_lib.CORRUPTION_PRESETS)}."
        )
    return names


def check_severities(config: ConfigDict) -> list[int]:
    """``config.shifts.severities`` as ints; ValueError outside 1..5."""
    bad = [v for v in config.shifts.severities if v not in (1, 2, 3, 4, 5)]
    if bad:
        raise ValueError(f"Corruption severities must be in 1..5, got {bad}.")
    return [int(v) for v in config.shifts.severities]


def resolve_shifts(config: ConfigDict, dataset):
    """``(source_or_None, corruption, severity)`` for every shifted test set.

    ``None`` as the source means "corrupt the test split with the JAX
    corruption on device"; otherwise the published shifted split is read.
    """
    s = config.shifts
    if s.corruptions.strip() in ("none", ""):
        return []
    severities = check_severities(config)
    if s.dataset:
        shifted = data_lib.get_dataset(
            s.dataset, data_dir=s.data_dir or config.dataset.data_dir or None
        )
        available = shifted.shifts()
        known = sorted({c for c, _ in available})
    else:
        shifted, known = None, list(corruptions.CORRUPTIONS)
    names = select_corruptions(s.corruptions, known, published=shifted is not None)
    out = []
    for name in names:
        for severity in severities:
            if shifted is None:
                out.append((None, name, severity))
            elif (name, severity) in available:
                out.append((shifted.source(f"{name}_{severity}"), name, severity))
    return out


def resolve_ood(config: ConfigDict, dataset) -> data_lib.OodSet | None:
    """The OOD set of ``config.ood`` (None when ``config.ood.dataset`` is '').

    Raises:
      ValueError: an unknown set or split, missing data, or images of another
        shape than ``dataset``'s.
    """
    ood = config.get("ood")
    if ood is None or not ood.dataset:
        return None
    found = data_lib.get_ood_set(
        ood.dataset,
        data_dir=ood.data_dir or config.dataset.data_dir or None,
        split=ood.split,
    )
    if tuple(found.image_shape) != tuple(dataset.image_shape):
        raise ValueError(
            f"config.ood.dataset '{ood.dataset}' has images of shape "
            f"{tuple(found.image_shape)}; the model of {dataset.name} takes "
            f"{tuple(dataset.image_shape)}."
        )
    return found


@functools.cache
def corruption(name: str, severity: int):
    """The jitted on-device corruption of eval batch ``i`` (compiled once per run).

    The corrupted test set depends only on (corruption, severity, batch index),
    never on the training seed, so every run and every method sees the same shift.
    """
    base = jax.random.key(SHIFT_SEED + list(corruptions.CORRUPTIONS).index(name))

    def corrupt(images, i):
        key = jax.random.fold_in(jax.random.fold_in(base, severity), i)
        return corruptions.corrupt(augment_lib.to_float(images), name, severity, key)

    return jax.jit(corrupt)


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """One evaluation set: its key, its source and an optional on-device transform.

    ``key`` is ``'val'``, ``'test'``, ``'shift/<corruption>/<severity>'`` or
    ``'ood'``; metrics are logged under it.
    """

    key: str
    source: object
    transform: Callable | None = None


def eval_sets(config: ConfigDict, dataset, shifts, ood) -> list[EvalSet]:
    """Every set the run evaluates, in the order its metrics are written."""
    out = []
    for key, split in (
        ("val", config.dataset.val_split),
        ("test", config.dataset.test_split),
    ):
        if split:
            out.append(EvalSet(key, dataset.source(split)))
    if config.dataset.test_split:
        test = dataset.source(config.dataset.test_split)
        for shifted, name, severity in shifts:
            if shifted is not None:  # a published shifted split
                out.append(EvalSet(f"shift/{name}/{severity}", shifted))
            else:
                out.append(
                    EvalSet(
                        f"shift/{name}/{severity}", test, corruption(name, severity)
                    )
                )
        if ood is not None:
            out.append(EvalSet(OOD_KEY, ood.source))
    return out


# ---- logits and metrics ------------------------------------------------------------


def collect(
    sets: list[EvalSet],
    eval_step: Callable,
    state,
    *,
    batches: Callable[[object], Iterator],
    batch_size: int,
    progress: Callable[[str, int], None] | None = None,
    mc_dropout: bool = False,
    keep_logits: bool = False,
) -> dict[str, SetResult]:
    """``{key: SetResult}`` of every set, in order (:func:`collect_set`).

    Args:
      sets: from :func:`eval_sets`.
      eval_step: the jitted ``(state, images) -> logits``, or with
        ``mc_dropout`` the step of :func:`mc_dropout_step`.
      state: the train state.
      batches: ``source -> context manager`` yielding placed global batches.
      batch_size: the global eval batch size (for ``progress``).
      progress: optional ``(key, images) -> None`` called after each batch.
      mc_dropout: whether ``eval_step`` is :func:`mc_dropout_step`'s.
      keep_logits: keep this process's rows of every set's logits.
    """
    out = {}
    for s in sets:
        n = len(s.source)
        with batches(s.source) as placed:
            if progress is not None:
                placed = _counted(placed, s.key, n, batch_size, progress)
            out[s.key] = collect_set(
                eval_step,
                state,
                placed,
                transform=s.transform,
                num_rows=n,
                split=s.key != OOD_KEY,
                mc_tag=mc_set_tag(s.key) if mc_dropout else None,
                keep_logits=keep_logits,
            )
    return out


def _counted(placed, key, n, batch_size, progress):
    for i, batch in enumerate(placed):
        yield batch
        progress(key, min(batch_size, n - i * batch_size))


def _combine(split: dict[str, dict[str, float]], ood) -> dict[str, float]:
    """The keys of :func:`score` from each set's split metrics and the OOD ones."""
    results: dict[str, float] = {}
    per_metric: dict[str, list[float]] = {}
    for key, values in split.items():
        for metric, value in values.items():
            results[f"{key}/{metric}"] = value
            if key.startswith("shift/"):
                per_metric.setdefault(metric, []).append(value)
    for metric, values in per_metric.items():
        results[f"shift/mean/{metric}"] = float(np.mean(values))
    for metric, value in (ood or {}).items():
        results[f"{OOD_KEY}/{metric}"] = value
    return results


def score(
    logits: dict[str, tuple[np.ndarray, np.ndarray]], *, batch_size: int | None = None
) -> dict[str, float]:
    """The metrics of every set of ``logits`` (a function of the logits alone).

    Keys, in order: ``<set>/<metric>`` of :data:`SPLIT_METRICS` for ``val``,
    ``test`` and each ``shift/<corruption>/<severity>`` set (in the order of
    ``logits``), ``shift/mean/<metric>`` (the mean over the shift sets, in
    that order), and ``ood/<metric>`` of :func:`ood_metrics` when ``logits``
    holds ``'ood'`` and ``'test'``.

    Args:
      logits: ``{key: (logits float32 [N, K], labels int32 [N])}``.
      batch_size: None: each set from its whole ``[N, K]`` array
        (:func:`split_metrics`, :func:`ood_metrics`). An int: batch by batch
        on the data mesh, as the evaluation of a state scores them
        (:func:`collect_set`, :func:`score_sets`): with the run's
        ``eval_batch_size`` and device count the run's numbers bit for bit,
        the class-wise ECE (float32 sums added batch by batch) included. The
        two agree bit for bit but for the class-wise ECE (float32 rounding).

    Raises:
      ValueError: a ``batch_size`` that is not a positive int or does not
        split over the devices.
    """
    if batch_size is None:
        split = {k: split_metrics(z, y) for k, (z, y) in logits.items() if k != OOD_KEY}
        ood = None
        if OOD_KEY in logits and "test" in logits:
            ood = ood_metrics(logits["test"][0], logits[OOD_KEY][0])
        return _combine(split, ood)
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    mesh = mesh_lib.data_mesh()
    mesh_lib.check_batch_size(batch_size, mesh, "batch_size")
    sharding = mesh_lib.batch_sharding(mesh)
    results = {}
    for key, (z, y) in logits.items():
        local = _array_batches(z, y, batch_size)
        placed = (mesh_lib.put_batch(b, sharding) for b in local)
        results[key] = collect_set(
            _logits_step, None, placed, num_rows=len(y), split=key != OOD_KEY
        )
    return score_sets(results)


def run_eval_batch_size(workdir: epath.PathLike, default: int) -> int:
    """The eval batch size a run scored its sets with: ``eval_batch_size`` of
    ``<workdir>/config.json`` (``default`` for a directory without one, or a
    config without the field). :func:`score` of the run's exported logits
    with it gives the run's numbers bit for bit (on the run's device count).
    """
    path = epath.Path(workdir) / "config.json"
    if not path.exists():
        return default
    found = json.loads(path.read_text()).get("eval_batch_size")
    return found if isinstance(found, int) and not isinstance(found, bool) else default


@jax.jit
def _logits_step(state, images):
    """The eval step of :func:`score`: the "images" are the logits."""
    del state
    return jnp.asarray(images, jnp.float32)


def _array_batches(z: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[dict]:
    """This process's slices of padded batches of ``(z, y)``, as
    :func:`calib_jax.data.pipeline.eval_batches` cuts a source."""
    local = batch_size // jax.process_count()
    for b in range(-(-len(y) // batch_size)):
        positions = b * batch_size + jax.process_index() * local + np.arange(local)
        mask = positions < len(y)
        image = np.zeros((local, *z.shape[1:]), z.dtype)
        label = np.zeros(local, np.int32)
        image[mask], label[mask] = z[positions[mask]], y[positions[mask]]
        yield {"image": image, "label": label, "mask": mask}


def score_sets(results: dict[str, SetResult]) -> dict[str, float]:
    """:func:`score`'s metrics of sets scored on the devices (:func:`collect`),
    from their rows and class-wise sums, plus :func:`mc_metrics` of the sets
    with MC dropout's mutual information."""
    split = {
        key: scoring.split_metrics_of_rows(r.rows, r.stats)
        for key, r in results.items()
        if key != OOD_KEY
    }
    ood = None
    if OOD_KEY in results and "test" in results:
        ood = scoring.ood_metrics_of_rows(results["test"].rows, results[OOD_KEY].rows)
    fields = {key: r.rows.fields for key, r in results.items() if r.rows.fields}
    return dict(_combine(split, ood), **mc_metrics(fields))


def evaluate(
    config: ConfigDict,
    sets: list[EvalSet],
    eval_step: Callable,
    state,
    put: Callable,
    decoded,
    *,
    progress: Callable[[str, int], None] | None = None,
    extras: dict[str, dict[str, np.ndarray]] | None = None,
    keep_logits: bool = True,
    rows: dict[str, scoring.SetRows] | None = None,
) -> tuple[dict[str, float], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Metrics of ``state`` on every set of ``sets``, and this process's logits.

    Args:
      config: the run's config (``eval_batch_size``, ``input.prefetch``,
        ``mc_dropout``).
      sets: from :func:`eval_sets`.
      eval_step: the jitted ``(state, images) -> logits`` over the data mesh;
        with ``config.mc_dropout.num_samples > 0``, :func:`mc_dropout_step`.
      state: the train state.
      put: places a process-local batch on the mesh.
      decoded: a :class:`calib_jax.data.cache.SplitCache` (each split decoded
        once).
      progress: as in :func:`collect`.
      extras: optional dict that receives, for :func:`export_logits`, this
        process's per-row fields of each set: MC dropout's
        ``mutual_information`` and, with more than one process, the rows'
        positions in the set (:data:`ROW_INDEX`).
      keep_logits: return this process's logits (False: an empty dict, and
        nothing is copied to the host but the rows).
      rows: optional dict that receives every set's
        :class:`scoring.SetRows` (the whole set, on every process).

    Returns:
      ``(score_sets(...), logits)``: the metrics (with MC dropout also
      :func:`mc_metrics`, ``<set>/mutual_information``) and ``{key:
      (logits [n, K], labels [n])}`` of this process's rows of each set (the
      whole set, in order, with one process).
    """
    kw = {
        "batch_size": config.eval_batch_size,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "to_float": False,
    }

    def batches(source):
        # Gathered from the decoded split and placed on the mesh ahead of use.
        local = pipeline.eval_batches(decoded.get(source), **kw)
        return prefetch_lib.Prefetcher(map(put, local), config.input.prefetch)

    found = collect(
        sets,
        eval_step,
        state,
        batches=batches,
        batch_size=config.eval_batch_size,
        progress=progress,
        mc_dropout=mc_dropout_samples(config) > 0,
        keep_logits=keep_logits,
    )
    if rows is not None:
        rows.update({key: r.rows for key, r in found.items()})
    logits = {}
    for key, r in found.items():
        if not keep_logits:
            continue
        logits[key] = (r.logits, r.labels)
        fields = dict(r.fields)
        if jax.process_count() > 1:
            fields[ROW_INDEX] = r.index
        if extras is not None and fields:
            extras[key] = fields
    return score_sets(found), logits


def evaluator(
    config: ConfigDict,
    sets: list[EvalSet],
    eval_step: Callable,
    put: Callable,
    decoded,
    *,
    logits_dir: epath.PathLike,
    ood_name: str = "",
) -> Callable[..., dict[str, float]]:
    """The trainer's ``evaluate(state, *, export, progress=None) -> metrics``.

    Args:
      config, sets, eval_step, put, decoded: as in :func:`evaluate` (with
        MC dropout, ``eval_step`` is :func:`mc_dropout_step`'s).
      logits_dir: where ``export=True`` writes the logits of every set
        (:func:`export_logits`: every process its own rows).
      ood_name: the OOD set's name (its file under ``logits_dir/ood/``).

    Returns:
      ``evaluate(state, *, export: bool, progress: int | None = None)``;
      ``progress`` None shows nothing, else the level of the bar over the
      images (0, or 1 under the benchmark's cell bar). Its attribute
      ``rows`` holds the last evaluation's ``{key: scoring.SetRows}`` (the
      trainer's final reliability diagram).
    """

    def run(state, *, export: bool, progress: int | None = None) -> dict:
        show = progress is not None and jax.process_index() == 0
        total = sum(len(s.source) for s in sets)
        level = progress or 0
        extras: dict[str, dict[str, np.ndarray]] = {}
        rows: dict[str, scoring.SetRows] = {}
        with progress_lib.Progress(total, enabled=show, level=level) as bar:
            results, logits = evaluate(
                config,
                sets,
                eval_step,
                state,
                put,
                decoded,
                progress=bar,
                extras=extras,
                keep_logits=export,
                rows=rows,
            )
        run.rows = rows
        if export:
            export_logits(logits_dir, logits, ood_name, extras=extras)
        return results

    run.rows = {}
    return run


# ---- MC dropout ----------------------------------------------------------------------


def mc_dropout_samples(config: ConfigDict) -> int:
    """``config.mc_dropout.num_samples`` (0 = off; 0 for a config without it).

    Raises:
      ValueError: not an int >= 0, or a ``config.mc_dropout.seed`` that is
        not one (one line).
    """
    mc = config.get("mc_dropout")
    if mc is None:
        return 0
    num = mc.get("num_samples", 0)
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ValueError(
            f"config.mc_dropout.num_samples must be an int >= 0 (0 = no MC "
            f"dropout), got {num!r}."
        )
    seed = mc.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"config.mc_dropout.seed must be an int >= 0, got {seed!r}.")
    return num


def check_mc_dropout(config: ConfigDict, model, info) -> int:
    """Checks ``config.mc_dropout`` against the model; returns the samples S.

    Args:
      config: the run's config.
      model: the flax model of ``config.model`` (None under MaC-Cal stage II).
      info: the dataset's metadata (``image_shape``).

    Returns:
      ``config.mc_dropout.num_samples`` (0 = off).

    Raises:
      ValueError: as :func:`mc_dropout_samples`; samples with MaC-Cal stage II,
        or with a model that has no dropout layer (one line naming
        ``config.mc_dropout.num_samples``, the model and its dropout rate).
    """
    num = mc_dropout_samples(config)
    if num == 0:
        return 0
    if model is None or config.two_stage.enabled:
        raise ValueError(
            f"config.mc_dropout.num_samples={num} is not supported with "
            "config.two_stage.enabled (MaC-Cal stage II); set it to 0."
        )
    sample = jax.ShapeDtypeStruct((1, *info.image_shape), jnp.float32)
    if models.count_dropout_layers(model, sample) == 0:
        rate = config.model.get("dropout_rate", 0.0)
        raise ValueError(
            f"config.mc_dropout.num_samples={num} needs a model with dropout, but "
            f"model '{config.model.name}' has none (config.model.dropout_rate="
            f"{rate}); set config.model.dropout_rate > 0 (models with dropout: "
            f"{', '.join(models.DROPOUT_MODELS)}) or config.mc_dropout.num_samples=0."
        )
    return num


def mc_set_tag(key: str) -> int:
    """The set's fold-in tag for MC dropout: CRC-32 of ``key`` in 31 bits.

    A fixed function of the set's name, so a set gets the same dropout
    samples in every evaluation (trainer or ``python -m calib_jax.evaluate``)
    whatever other sets are evaluated beside it.
    """
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


def mc_dropout_step(config: ConfigDict, model, info, steps) -> Callable:
    """The jitted MC-dropout eval step of ``config.mc_dropout``.

    ``step(state, images, tag, first_row) -> {'logits': float32 [B, K],
    'mutual_information': float32 [B]}``: :func:`calib_jax.models.
    mc_dropout_predict` with ``num_samples`` samples of the preprocessed
    images (BatchNorm on its running averages, every dropout layer sampled)
    and the key ``fold_in(key(config.mc_dropout.seed), tag)``; ``tag`` is
    :func:`mc_set_tag` of the set and ``first_row`` the batch's first row in
    the set. Row ``r`` of a set thus gets the same dropout masks whatever the
    eval batch size, padding or sharding (they depend on the seed, the set's
    name and ``r`` only; the logits up to the float rounding of another batch
    shape).

    Args:
      config: the run's config (checked with :func:`check_mc_dropout`).
      model: the flax model.
      info: the dataset's metadata (``mean``, ``std``).
      steps: the run's :class:`calib_jax.train.sharded_step.ShardedStep`
        (its state and batch shardings).
    """
    num = check_mc_dropout(config, model, info)
    seed = int(config.mc_dropout.seed)

    def step(state, images, tag, first_row):
        key = jax.random.fold_in(jax.random.key(seed), tag)
        out = models.mc_dropout_predict(
            model,
            state_variables(state),
            sharded_step.preprocess(info, images),
            key=key,
            num_samples=num,
            first_row=first_row,
        )
        return {"logits": out.logits, MUTUAL_INFORMATION: out.mutual_information}

    rows, repl = steps.batch_sharding, steps.replicated
    return jax.jit(
        step,
        in_shardings=(steps.state_sharding, rows, repl, repl),
        out_shardings=rows,
    )


def mc_metrics(extras: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """``<set>/mutual_information``: the mean MC-dropout mutual information
    of each set's rows (float64 mean), for the sets of ``extras`` that have it."""
    return {
        f"{key}/{MUTUAL_INFORMATION}": float(
            np.mean(v[MUTUAL_INFORMATION], dtype=np.float64)
        )
        for key, v in extras.items()
        if MUTUAL_INFORMATION in v
    }
