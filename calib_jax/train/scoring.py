"""A set's metrics from per-row values, with no process holding its ``[N, K]`` logits.

The end-of-run (and periodic) evaluation scores each batch where its logits
are, on the devices that computed them (rows sharded over the data mesh):

- the softmax of the batch (``jax.nn.softmax`` of the float32 logits, its own
  program, as :func:`calib_jax.train.evaluate.split_metrics` calls it on the
  whole set), then per row :func:`row_values`: the top-label confidence and
  correctness (:func:`calib_jax.metrics.top_label_rows`; the confidence is
  also the maximum-softmax OOD score), the NLL and the Brier score of the
  row, as :func:`calib_jax.metrics.nll` and :func:`calib_jax.metrics.brier`
  compute them before their mean: ``O(B)`` values a batch;
- the class-wise ECE's per-class, per-bin sums
  (:class:`calib_jax.metrics.BinnedStats` with ``classwise=True`` and exact
  confidence sums, ``O(K * bins)``), added on the devices batch by batch
  (:func:`add_classwise`).

:class:`SetScorer` keeps the rows of every batch on the devices and gathers
them across processes once per set (:func:`gather`: one
``process_allgather`` of ``[B]`` arrays, ``O(N)`` values in all, never a
class axis). :func:`split_metrics_of_rows` and :func:`ood_metrics_of_rows`
then compute the metrics from the rows with the metric functions of today's
``split_metrics``/``ood_metrics`` on ``[N, K]`` probabilities: accuracy, ECE
and adaptive ECE by :func:`calib_jax.metrics.summary` on
:class:`~calib_jax.metrics.TopLabelRows`, NLL and Brier by the same masked
mean of the same per-row values, the OOD metrics of the same scores. They
equal the values of the gathered logits bit for bit when XLA computes the
batch's softmax row sums as it does the whole set's (``docs/evaluate.md``,
"Scoring without gathering logits"). The class-wise ECE's confidence sums
are exact integers until rounded once, so adding them batch by batch gives
the whole set's bit for bit, whatever the batches, devices and processes.

:func:`local_rows` is the process's own rows of a row-sharded array (what
the process exports: each writes its shard of every set's logits).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from calib_jax import metrics

# Bins of every binned split metric (today's split_metrics: metrics.summary's
# default, 15 equal-width or equal-mass bins).
NUM_BINS = 15
# The split metrics computed from the gathered top-label rows.
TOP_LABEL_METRICS = ("accuracy", "ece", "adaptive_ece")
# The per-row values of a split (every field of SetRows but the extras).
ROW_FIELDS = ("confidence", "correct", "nll", "brier")


class SetRows(NamedTuple):
    """The per-row values of one whole set (every process holds them).

    Attributes:
      confidence: float32 ``[N]``, :math:`\\max_k p_{ik}` (also the maximum
        softmax probability, the OOD score).
      correct: bool ``[N]``, whether the first maximal class is the label.
      nll: float32 ``[N]``, :math:`-\\log \\max(p_{iy_i}, t)`.
      brier: float32 ``[N]``, :math:`\\sum_k p_{ik}^2 - 2 p_{iy_i} + 1`.
      fields: further per-row fields of the eval step (MC dropout's
        ``mutual_information``), float32 ``[N]`` each.
    """

    confidence: np.ndarray
    correct: np.ndarray
    nll: np.ndarray
    brier: np.ndarray
    fields: dict[str, np.ndarray]


def probabilities(logits: jax.Array) -> jax.Array:
    """``jax.nn.softmax`` of the float32 logits over the last axis, as its own
    compiled program (split_metrics' softmax of the whole set, on a batch)."""
    return jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)


@jax.jit
def row_values(probs: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    """The per-row values of :class:`SetRows` of a batch (pure, row-wise).

    Args:
      probs: float32 ``[B, K]`` probabilities (rows sharded or not).
      labels: int ``[B]``; any value on rows that are masked out.

    Returns:
      ``{'confidence', 'correct', 'nll', 'brier'}``, each ``[B]``: the
      confidence and correctness of :func:`calib_jax.metrics.top_label_rows`,
      the per-row terms of :func:`calib_jax.metrics.nll` (:math:`t` the
      smallest normal float32) and of :func:`calib_jax.metrics.brier`
      (Def. A.2, Eq. (19) of Zhou et al., "Revisiting Reweighted Risk for
      Calibration").
    """
    labels = labels.astype(jnp.int32)
    rows = metrics.top_label_rows(probs, labels)
    p_label = jnp.take_along_axis(probs, labels[:, None], axis=1)[:, 0]
    tiny = jnp.finfo(p_label.dtype).tiny
    return {
        "confidence": rows.confidence,
        "correct": rows.correct,
        "nll": -jnp.log(jnp.maximum(p_label, tiny)),
        "brier": jnp.sum(probs * probs, axis=1) - 2.0 * p_label + 1.0,
    }


def classwise_stats(probs, labels, valid=None) -> metrics.BinnedStats:
    """The class-wise statistics of the class-wise ECE of a set or batch:
    :data:`NUM_BINS` equal-width bins, exact confidence sums (merged batch by
    batch they are the whole set's bit for bit)."""
    return metrics.BinnedStats.from_batch(
        probs,
        labels.astype(jnp.int32),
        num_bins=NUM_BINS,
        classwise=True,
        where=valid,
        exact_sums=True,
    )


@jax.jit
def add_classwise(
    stats: metrics.BinnedStats, probs: jax.Array, labels: jax.Array, valid: jax.Array
) -> metrics.BinnedStats:
    """``stats`` plus the class-wise binned sums of a batch's included rows
    (``[K, S]`` tables on the device; pure, traced, so no value checks)."""
    return stats.merge(classwise_stats(probs, labels, valid))


# XLA:CPU reduces the rows of an array of at most this many entries (per
# device) on another code path than a larger one's: the float32 row sums of
# a softmax differ in the last bit in about a third of the rows (measured
# with jaxlib 0.10.2: [409, 10] and [585, 7] take the one path, [410, 10]
# and [586, 7] the other).
CPU_SMALL_ENTRIES = 4096


def block_rows(rows: int, num_classes: int, num_rows: int, x: jax.Array) -> int:
    """The rows per device a batch is scored in, on the reduction path of the set.

    Today's ``split_metrics`` reduces the whole set's ``[N, K]`` array in one
    program; on the CPU a batch of ``rows`` rows per device is scored in
    blocks on the same side of :data:`CPU_SMALL_ENTRIES` as ``N * K``: padded
    with masked rows above it (a large set), or cut to its first rows below
    it (a set of at most that many entries, whose rows all fit). Other
    backends keep ``rows``.
    """
    if next(iter(x.sharding.device_set)).platform != "cpu":
        return rows
    limit = CPU_SMALL_ENTRIES // num_classes  # most rows on the small path
    if num_rows * num_classes > CPU_SMALL_ENTRIES:
        return max(rows, limit + 1)
    return min(rows, max(limit, 1))


def _row_shards(x: jax.Array) -> int:
    """How many blocks of rows ``x`` is split into over its devices."""
    return x.shape[0] // x.sharding.shard_shape(x.shape)[0]


@functools.partial(jax.jit, static_argnames=("shards", "rows"))
def _reblock(tree, *, shards: int, rows: int):
    """Each device's block of rows of every array of ``tree``, padded (zeros,
    False) or cut to ``rows`` rows, in place: ``[shards * r, ...] -> [shards
    * rows, ...]`` with the rows never leaving their device."""

    def one(x):
        blocks = x.reshape(shards, -1, *x.shape[1:])
        have = blocks.shape[1]
        if rows < have:
            blocks = blocks[:, :rows]
        else:
            pad = [(0, 0), (0, rows - have)] + [(0, 0)] * (x.ndim - 1)
            blocks = jnp.pad(blocks, pad)
        return blocks.reshape(shards * rows, *x.shape[1:])

    return jax.tree.map(one, tree)


def gather(tree):
    """Every process's rows of a pytree of row-sharded ``[B]`` arrays, as host
    arrays (``multihost_utils.process_allgather``, tiled): the only transfer
    between processes of the evaluation."""
    return multihost_utils.process_allgather(tree, tiled=True)


def local_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(values, index)``: this process's rows of ``x`` (sharded along its
    first axis, or not) and their positions in ``x``, in increasing order.

    Each distinct row block of the process's devices is read once (a block
    replicated over other mesh axes is not read again); no other process's
    rows are transferred.
    """
    blocks = {}
    for shard in x.addressable_shards:
        rows = shard.index[0] if shard.index else slice(None)
        start = rows.start or 0
        blocks.setdefault(start, shard.data)
    starts = sorted(blocks)
    values = jax.device_get([blocks[s] for s in starts])
    index = np.concatenate([s + np.arange(v.shape[0]) for s, v in zip(starts, values)])
    return np.concatenate(values), index


class SetScorer:
    """Accumulates one set's per-row values (and class-wise sums) batch by batch.

    Args:
      num_rows: the set's rows ``N`` (:func:`block_rows`).
      split: whether the set is scored with the split metrics (rows and the
        class-wise sums); False for the OOD set, whose rows give only the
        confidence (labels ``-1``).
    """

    def __init__(self, num_rows: int, *, split: bool = True):
        self.num_rows = num_rows
        self.split = split
        self._batches: list[dict[str, jax.Array]] = []
        self._stats: metrics.BinnedStats | None = None

    def add(self, logits: jax.Array, labels: jax.Array, mask: jax.Array, **fields):
        """Scores one padded batch on its devices (no host transfer).

        Args:
          logits: float ``[B, K]``, rows sharded over the data mesh.
          labels: int ``[B]``.
          mask: bool ``[B]``, False on padding rows.
          **fields: further per-row ``[B]`` values to gather (MC dropout's
            mutual information).
        """
        k = logits.shape[-1]
        shards = _row_shards(logits)
        rows = logits.shape[0] // shards
        target = block_rows(rows, k, self.num_rows, logits)
        if target != rows:
            logits, labels, valid = _reblock(
                (logits, labels, mask), shards=shards, rows=target
            )
        else:
            valid = mask
        probs = probabilities(logits)
        values = row_values(probs, labels)
        if self.split:
            if self._stats is None:
                self._stats = metrics.BinnedStats.empty(
                    NUM_BINS, num_classes=k, exact_sums=True
                )
            self._stats = add_classwise(self._stats, probs, labels, valid)
        else:
            values = {"confidence": values["confidence"]}
        if target != rows:
            values = _reblock(values, shards=shards, rows=rows)
        self._batches.append(dict(values, mask=mask, **fields))

    def finish(self) -> tuple[SetRows, metrics.BinnedStats | None]:
        """``(rows, stats)``: the set's rows, padding removed, from every
        process (one :func:`gather`), and the class-wise sums (None for an
        OOD set)."""
        if not self._batches:
            raise ValueError("the evaluation set has no rows; expected >= 1 row.")
        gathered = gather(self._batches)
        keep = np.concatenate([np.asarray(b["mask"], bool) for b in gathered])

        def column(name):
            return np.concatenate([np.asarray(b[name]) for b in gathered])[keep]

        names = self._batches[0].keys() - {"mask", *ROW_FIELDS}
        fields = {name: column(name) for name in sorted(names)}
        if self.split:
            values = [column(name) for name in ROW_FIELDS]
        else:
            conf = column("confidence")
            zeros = np.zeros_like(conf)
            values = [conf, zeros.astype(bool), zeros, zeros]
        return SetRows(*values, fields=fields), self._stats


@jax.jit
def _mean(values):
    """The masked mean of ``calib_jax.metrics.nll`` and ``brier`` with every row
    included: the float32 sum of the ``[N]`` values over the row count."""
    valid = jnp.ones(values.shape, bool)
    total = jnp.sum(jnp.where(valid, values, 0.0))
    return total / jnp.maximum(jnp.sum(valid.astype(values.dtype)), 1.0)


def split_metrics_of_rows(
    rows: SetRows, stats: metrics.BinnedStats
) -> dict[str, float]:
    """:data:`calib_jax.metrics.SPLIT_METRICS` of a set from its rows and sums.

    ``accuracy``, ``ece`` (15 equal-width bins, l1) and ``adaptive_ece`` (15
    equal-mass bins) by :func:`calib_jax.metrics.summary` of the rows'
    :class:`~calib_jax.metrics.TopLabelRows`; ``nll`` and ``brier`` the mean
    of the rows' values; ``classwise_ece`` (Def. A.1, Eq. (18) of Zhou et
    al.) of the class-wise sums (:meth:`calib_jax.metrics.BinnedStats.compute`).
    """
    top = metrics.TopLabelRows(rows.confidence, rows.correct)
    found = metrics.summary(top, None, num_bins=NUM_BINS, names=TOP_LABEL_METRICS)
    values = {
        **found,
        "nll": _mean(rows.nll),
        "brier": _mean(rows.brier),
        "classwise_ece": stats.compute(1),
    }
    return {name: float(values[name]) for name in metrics.SPLIT_METRICS}


def ood_metrics_of_rows(test: SetRows, ood: SetRows) -> dict[str, float]:
    """The OOD metrics of the maximum softmax probability of the test rows
    (positive) against the OOD rows (as ``evaluate.ood_metrics`` of logits)."""
    s_in, s_out = jnp.asarray(test.confidence), jnp.asarray(ood.confidence)
    return {
        "auroc": float(metrics.ood_auroc(s_in, s_out)),
        "aupr_in": float(metrics.ood_aupr(s_in, s_out, positive="in")),
        "aupr_out": float(metrics.ood_aupr(s_in, s_out, positive="out")),
        "fpr_at_95_tpr": float(metrics.fpr_at_95_tpr(s_in, s_out)),
    }
