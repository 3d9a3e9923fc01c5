r"""The reported metrics over a sequence of chunks: :func:`summary_of_chunks`.

:func:`calib_jax.metrics.summary` needs the whole ``[N, K]`` array; here it
arrives a chunk at a time (:mod:`calib_jax.chunks`: an iterator of arrays, or
``.npz``/``.npy`` shards, local or ``gs://``) and memory stays bounded by the
chunk plus ``O(N)`` per-row scalars:

- per chunk, one jitted function (compiled once: every chunk has the rows of
  the first, the last one padded and masked with ``where``) computes the
  mergeable statistics: the class-wise per-bin sums of ``classwise_ece``
  (:class:`~calib_jax.metrics.BinnedStats` with ``classwise=True``, added on
  the device), the sums of the per-row NLL and Brier score, and the per-row
  top-label confidence and correctness (:class:`~calib_jax.metrics.TopLabelRows`,
  5 bytes a row). Logits (``from_logits=True``) go through one fused pass
  of row reductions (:func:`_logit_rows.fused_rows`: one row maximum and
  one exponential per logit for the confidence ``1/s``, the correctness,
  the label's log-probability, the Brier row and the finiteness; the
  confidence and correctness from the very reductions of every metric's
  ``from_logits=True``, so the same bits), and through a softmax of the
  chunk only for the class-wise bins;
- shard chunks are read into memory by a background thread, ``PREFETCH``
  chunks ahead (:func:`calib_jax.chunks.prefetched`), and ``IN_FLIGHT``
  chunk steps are dispatched before the host waits for the oldest one's
  results: the read, the host's work and two steps overlap (two cores);
- the top-label metrics (``accuracy``, ``ece``, ``ece_l2_em``,
  ``adaptive_ece``, ``ks_error``, ``aurc``) are then computed once from the
  ``N`` collected ``(confidence, correct)`` rows (STYLE.md: sort-based
  metrics collect them on the host, once per split), by the very metric
  functions of :func:`~calib_jax.metrics.summary` on ``TopLabelRows``: equal
  to the in-memory values bit for bit, equal-mass bins and order statistics
  included, whenever the chunk's rows equal the whole array's. For
  probabilities they always do (the confidence is an entry); for logits
  XLA:CPU computes the exponentials of arrays under about 4,800 entries on
  another code path (a last-ulp difference of ``1/s`` in a third of the rows
  of ``[400, 10]`` chunks of a ``[1000, 10]`` array, none from ``[480, 10]``
  on), so chunks of a large label space are exact and tiny chunks of a
  10-class problem are not.

Class-wise ECE, NLL and Brier come from float32 sums added in another order
than one pass over ``[N, K]`` (chunk partials, the scalars added in float64
on the host), so they equal the in-memory values to float32 rounding
(about 1e-6 relative); the counts are exact.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks, chunks
from calib_jax.metrics import (
    _binned_stats,
    _common,
    _conventions,
    _inputs,
    _logit_rows,
    _summary,
    _validate,
)

# Chunks read ahead by the source's background thread, and chunk steps the
# device may run at once (the host waits for the oldest before it starts
# another): memory stays bounded by a few chunks.
PREFETCH = 2
IN_FLIGHT = 2

# The summary keys computed from the collected (confidence, correct) rows.
ROW_METRICS = ("accuracy", "ece", "ece_l2_em", "adaptive_ece", "ks_error", "aurc")


def _per_row(probs, labels):
    """Per-row NLL and Brier score of probabilities, as ``metrics.nll`` and
    ``metrics.brier`` compute them before their mean."""
    p_label = _common.label_prob(probs, labels)
    tiny = jnp.finfo(p_label.dtype).tiny
    nll = -jnp.log(jnp.maximum(p_label, tiny))
    return nll, jnp.sum(probs * probs, axis=1) - 2.0 * p_label + 1.0


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def chunk_step(stats, x, labels, valid, num_bins, convention, from_logits, classwise):
    """The statistics of one chunk (pure; compiled once per chunk shape).

    Args:
      stats: the running class-wise :class:`~calib_jax.metrics.BinnedStats`
        (``[K, S]`` tables; ``None`` without ``classwise``).
      x: float ``[R, K]`` logits or probabilities.
      labels: int32 ``[R]``.
      valid: bool ``[R]``; False on the padding rows of the last chunk.
      num_bins, convention: static, of the class-wise bins.
      from_logits: static; ``x`` are logits (bf16, fp16 or float32).
      classwise: static; accumulate the class-wise statistics.

    Returns:
      ``(stats, rows, sums, checks)``: ``stats`` merged with this chunk's;
      ``rows = (conf [R], correct bool [R])`` (:func:`_inputs.rows_from_logits`
      or the confidence in the dtype of the probabilities); ``sums = (nll, brier)``
      float32 sums over the chunk's included rows; ``checks = (count, first)``
      of included rows that fail the value checks (logits: NaN/inf; probabilities:
      the screen of :func:`calib_jax.metrics._validate.probs_summary`).
    """
    dtype = x.dtype
    if from_logits:
        # One fused pass of row reductions (one row maximum, one exponential
        # per logit); the confidence and correctness are the bits of every
        # metric's from_logits=True (_inputs.rows_from_logits), the NLL and
        # Brier rows theirs to float32 rounding. The softmax only for the
        # class-wise bins.
        conf, correct, log_p, brier, finite = _logit_rows.fused_rows(x, labels)
        bad = valid & ~finite
        nll = -log_p
        probs = _inputs.softmax(x) if classwise else None
    else:
        # The metrics' value screen (``_validate.probs_summary``), per row, from
        # the row sums of the top-label reduction itself.
        probs = _common.as_float(x)
        conf, correct, screened = _common.top_label(probs, labels, screen=True)
        conf = conf.astype(dtype)  # as _inputs.rows_from_probs (exact: an entry)
        tol = _validate.simplex_tolerance(dtype)
        eps = float(jnp.finfo(probs.dtype).eps)
        margin = tol - min(2.0 * probs.shape[1] * eps, 0.5 * tol)
        screened = jnp.where(conf <= 1.0 + tol, screened, jnp.nan)
        bad = valid & ~(jnp.abs(screened - 1.0) <= margin)
        nll, brier = _per_row(probs, labels)
    sums = (jnp.sum(jnp.where(valid, nll, 0.0)), jnp.sum(jnp.where(valid, brier, 0.0)))
    if classwise:
        part = _binned_stats.stats_from_batch(
            probs, labels, valid, num_bins, convention, True
        )
        stats = stats.merge(part)
    checks = (jnp.sum(bad.astype(jnp.int32)), jnp.argmax(bad))
    return stats, (conf, correct), sums, checks


@jax.jit
def _explain_rows(x, valid, tol):
    """The first included row of probabilities that fails the exact value
    checks (``_validate.explain``'s): ``(row, kind, value)`` with ``kind`` 0
    for none, 1 NaN/inf, 2 an entry outside ``[0, 1 + tol]`` (``value`` the
    entry), 3 a row sum off 1 by more than ``tol`` (``value`` the sum)."""
    x = _common.as_float(x)
    finite = jnp.all(jnp.isfinite(x), axis=1)
    low, high = jnp.min(x, axis=1), jnp.max(x, axis=1)
    sums = jnp.sum(x, axis=1)
    nonfinite = valid & ~finite
    outside = valid & finite & ((low < 0.0) | (high > 1.0 + tol))
    off = valid & finite & (jnp.abs(sums - 1.0) > tol)
    kind = jnp.where(nonfinite, 1, jnp.where(outside, 2, jnp.where(off, 3, 0)))
    row = jnp.argmax(kind > 0)
    value = jnp.where(low[row] < 0.0, low[row], high[row])
    return row, kind[row], jnp.where(kind[row] == 3, sums[row], value)


def _raise_for_chunk(chunk, x, valid, count, first, from_logits, dtype) -> None:
    """The one-line ValueError for the rows of ``chunk`` that failed its checks."""
    if from_logits:
        raise ValueError(
            f"{chunk.where(first)}: logits contain NaN or inf ({count} row(s) of "
            "the chunk); expected finite logits."
        )
    tol = _validate.simplex_tolerance(dtype)
    row, kind, value = (v.item() for v in jax.device_get(_explain_rows(x, valid, tol)))
    hint = " If these are logits, pass from_logits=True."
    if kind == 1:
        raise ValueError(
            f"{chunk.where(row)}: probs contain NaN or inf; expected finite "
            f"probabilities.{hint}"
        )
    if kind == 2:
        raise ValueError(
            f"{chunk.where(row)}: probs must be probabilities in [0, 1]; found "
            f"{value:.4g}.{hint}"
        )
    if kind == 3:
        raise ValueError(
            f"{chunk.where(row)}: rows of probs must sum to 1 (tolerance "
            f"{tol:.1e}); the row sums to {value:.6g}.{hint}"
        )
    # Otherwise the screen's margin flagged rows that pass the exact checks.


@functools.partial(jax.jit, static_argnums=(2, 3))
def _row_metrics(conf, correct, names, num_bins):
    """The top-label summary metrics of ``N`` rows ``(confidence, correct)``:
    the functions of :func:`_summary.summary_functions` on
    :class:`~calib_jax.metrics.TopLabelRows` (traced: no value checks; the
    chunks were checked)."""
    functions = _summary.summary_functions(num_bins)
    rows = _inputs.TopLabelRows(conf, correct)
    return tuple(functions[k](rows, None) for k in names)


def summary_of_chunks(
    source,
    *,
    from_logits: bool = False,
    num_bins: int = 15,
    names: Sequence[str] | None = None,
    chunk_rows: int = chunks.DEFAULT_CHUNK_ROWS,
    progress_bar: bool = True,
) -> dict[str, jax.Array]:
    r""":func:`calib_jax.metrics.summary` of scores that arrive in chunks.

    The same dict, over every row of every chunk, with memory bounded by a
    few chunks (``chunk_rows`` rows of ``K`` classes: two read ahead by a
    background thread from shards, the current one and two whose steps are
    in flight) plus 5 bytes per row. The metrics and their conventions are those
    of :data:`~calib_jax.metrics.SUMMARY_METRICS` (see
    :func:`~calib_jax.metrics.summary` for the equations and references):
    ``accuracy``, ``ece``, ``ece_l2_em``, ``adaptive_ece``, ``ks_error`` and
    ``aurc`` equal the in-memory values bit for bit (from the collected
    per-row confidence and correctness, exact equal-mass bins and order
    statistics, no approximation); ``classwise_ece``, ``nll`` and ``brier``
    come from per-chunk sums, equal to float32 rounding. With
    ``from_logits`` the values are those of ``summary(logits, labels,
    from_logits=True)``, computed one chunk at a time on the device (the
    module docstring says when XLA's rounding of small chunks differs).

    Args:
      source: a :class:`calib_jax.chunks.ChunkSource`; or what it takes: an
        iterable of ``(x [n, K], labels [n])`` pairs, a glob string or a list
        of ``.npz``/``.npy`` shard paths, local or ``gs://`` (layout in
        :mod:`calib_jax.chunks`).
      from_logits: the scores are logits (bf16, fp16 or float32); else rows
        on the probability simplex. Also the array read from ``.npz`` shards:
        ``logits`` or ``probs``.
      num_bins: static, bins of the binned metrics.
      names: the keys to compute, in the returned order (default: every key
        of :data:`~calib_jax.metrics.SUMMARY_METRICS`).
      chunk_rows: rows per chunk (a given ``ChunkSource`` keeps its own).
      progress_bar: a bar over the chunks on stderr.

    Returns:
      ``{key: float32 scalar}``.

    Raises:
      ValueError: one line naming the shard or item and what was expected
        (see :mod:`calib_jax.chunks`), NaN/inf logits, probabilities off
        the simplex; all before a value is returned.

    Examples:
      >>> import numpy as np
      >>> from calib_jax.metrics._streamed import summary_of_chunks
      >>> probs = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = np.array([0, 0, 0, 1])
      >>> pairs = [(probs[:3], labels[:3]), (probs[3:], labels[3:])]
      >>> out = summary_of_chunks(pairs, names=("accuracy", "brier"), chunk_rows=2)
      >>> print({k: round(float(v), 3) for k, v in out.items()})
      {'accuracy': 0.75, 'brier': 0.35}
    """
    names = _summary.check_names(
        tuple(_summary.SUMMARY_METRICS) if names is None else names
    )
    m = _checks.check_num_bins(num_bins)
    convention = _conventions.get_convention(_conventions.DEFAULT)
    source = chunks.as_source(
        source,
        chunk_rows=chunk_rows,
        key="logits" if from_logits else "probs",
        check_finite=False,  # checked on the device, in chunk_step
        progress_bar=progress_bar,
        desc="summary",
        prefetch=PREFETCH,
    )
    classwise = "classwise_ece" in names
    state = _State()
    rows = stats = None
    pending = collections.deque()
    for chunk in source:
        if rows is None:
            rows, k = chunk.x.shape
            if k < 2:
                raise ValueError(
                    f"{chunk.where(0)}: the scores have K = {k} class(es); a "
                    "metric needs K >= 2 classes."
                )
            if classwise:
                stats = _binned_stats.BinnedStats.empty(
                    m, convention=convention, num_classes=k
                )
        x, labels, valid = chunks.padded(chunk, rows)
        # The oldest step's results, once IN_FLIGHT steps are dispatched: the
        # device computed them while the host read this chunk (and the source's
        # thread the next ones). Waiting for them keeps at most IN_FLIGHT steps
        # and their chunks in flight (the memory bound: their chunks and
        # temporaries) while two steps can use two cores.
        if len(pending) == IN_FLIGHT:
            state.add(*pending.popleft())
        stats, *out = chunk_step(
            stats, x, labels, valid, m, convention, bool(from_logits), classwise
        )
        pending.append((chunk, x, valid, out, bool(from_logits)))
    while pending:
        state.add(*pending.popleft())
    return state.values(names, m, stats)


class _State:
    """The host side of :func:`summary_of_chunks`: collected rows and sums."""

    def __init__(self):
        self.conf, self.correct = [], []
        self.nll = self.brier = 0.0
        self.total = 0

    def add(self, chunk, x, valid, out, from_logits) -> None:
        (conf, correct), sums, (count, first) = jax.device_get(out)
        if count:
            _raise_for_chunk(
                chunk, x, valid, int(count), int(first), from_logits, x.dtype
            )
        n = chunk.x.shape[0]
        self.conf.append(conf[:n])
        self.correct.append(correct[:n])
        self.nll += float(sums[0])
        self.brier += float(sums[1])
        self.total += n

    def values(self, names, num_bins, stats) -> dict[str, jax.Array]:
        out = {}
        on_rows = tuple(k for k in names if k in ROW_METRICS)
        if on_rows:
            conf, correct = np.concatenate(self.conf), np.concatenate(self.correct)
            out.update(zip(on_rows, _row_metrics(conf, correct, on_rows, num_bins)))
        n = max(self.total, 1)
        out["nll"] = jnp.asarray(self.nll / n, jnp.float32)
        out["brier"] = jnp.asarray(self.brier / n, jnp.float32)
        if stats is not None:  # the class mean of Def. A.1 (classwise_ece)
            out["classwise_ece"] = _binned_stats.stats_error(stats, 1.0)
        return {k: out[k] for k in names}
