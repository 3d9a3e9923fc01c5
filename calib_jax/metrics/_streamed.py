r""":func:`summary_of_chunks`: :func:`calib_jax.metrics.summary` over chunks, with
mergeable sums per chunk and the top-label metrics from the collected per-row
``(confidence, correct)`` (``docs/streaming.md``)."""

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

# Chunks read ahead by the source's thread, and chunk steps in flight at once:
# memory stays bounded by a few chunks.
PREFETCH = 2
IN_FLIGHT = 2

# The summary keys computed from the collected (confidence, correct) rows.
ROW_METRICS = ("accuracy", "ece", "ece_l2_em", "adaptive_ece", "ks_error", "aurc")


def _per_row(probs, labels):
    """Per-row NLL and Brier score, as ``metrics.nll`` and ``metrics.brier``."""
    p_label = _common.label_prob(probs, labels)
    tiny = jnp.finfo(p_label.dtype).tiny
    nll = -jnp.log(jnp.maximum(p_label, tiny))
    return nll, jnp.sum(probs * probs, axis=1) - 2.0 * p_label + 1.0


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def chunk_step(stats, x, labels, valid, num_bins, convention, from_logits, classwise):
    """One chunk's ``(stats, (conf, correct), (nll, brier), (count, first))``:
    class-wise ``stats`` (or None) merged with its own, float32 sums over
    ``valid`` rows, and the included rows failing the value checks."""
    dtype = x.dtype
    if from_logits:
        # The confidence and correctness bits of every metric's from_logits=True.
        conf, correct, log_p, brier, finite = _logit_rows.fused_rows(x, labels)
        bad = valid & ~finite
        nll = -log_p
        probs = _inputs.softmax(x) if classwise else None
    else:
        # _validate.probs_summary's screen, per row.
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
    """``(row, kind, value)`` of the first included row failing the exact checks:
    ``kind`` 0 none, 1 NaN/inf, 2 an entry outside ``[0, 1 + tol]`` (``value``
    the entry), 3 a row sum off 1 by more than ``tol`` (``value`` the sum)."""
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
    """The top-label summary metrics of the collected rows (checked per chunk)."""
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

    The same dict over every row of every chunk, with memory bounded by a few
    chunks plus 5 bytes per row; equations and references as
    :func:`~calib_jax.metrics.summary`. ``accuracy``, ``ece``, ``ece_l2_em``,
    ``adaptive_ece``, ``ks_error`` and ``aurc`` equal the in-memory values bit
    for bit (from the collected per-row confidence and correctness);
    ``classwise_ece``, ``nll`` and ``brier`` come from per-chunk sums, equal
    to float32 rounding. For logits XLA:CPU rounds the exponentials of chunks
    under about 4,800 entries differently (a last-ulp difference of the
    confidence), so tiny chunks of a 10-class problem are not bit for bit.

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
        # Waiting for the oldest step bounds memory to IN_FLIGHT steps' chunks.
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
