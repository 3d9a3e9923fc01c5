r"""The input forms of the metrics: probabilities, logits (``from_logits``) and
:class:`TopLabelRows`; conventions in ``docs/metrics.md``, "Logits and top-label
rows in"."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.metrics import _common, _logit_rows, _validate

PROBS, LOGITS, ROWS = "probs", "logits", "rows"


class TopLabelRows(NamedTuple):
    """Per-row top-label confidence and correctness (a pytree).

    Attributes:
      confidence: float ``[N]``, the top-label probability :math:`\\max_k
        p_{ik}` in [0, 1].
      correct: bool ``[N]``, whether the first maximal class is the label.
    """

    confidence: jax.Array
    correct: jax.Array


def input_form(x, labels, *, from_logits, metric: str, top_label: bool = True) -> str:
    """Which input a metric got: :data:`PROBS`, :data:`LOGITS` or :data:`ROWS`;
    rows with labels, with ``from_logits`` or where ``top_label=False`` raise."""
    from_logits = _checks.check_bool("from_logits", from_logits)
    if isinstance(x, TopLabelRows):
        if not top_label:
            raise ValueError(
                f"{metric} needs [N, K] probabilities (or logits with "
                "from_logits=True); got TopLabelRows, which hold only each "
                "row's top-label confidence and correctness."
            )
        if from_logits:
            raise ValueError(
                "from_logits=True takes [N, K] logits; got TopLabelRows (pass "
                "the rows with from_logits=False)."
            )
        if labels is not None:
            shape = getattr(labels, "shape", None)
            raise ValueError(
                "labels must be None with TopLabelRows (the rows carry their "
                f"correctness); got labels{'' if shape is None else f' of shape {shape}'}."
            )
        return ROWS
    return LOGITS if from_logits else PROBS


def rows_from_logits(logits, labels) -> TopLabelRows:
    r"""Top-label rows of logits: :math:`c_i = 1/s_i`, :math:`a_i =
    [\hat y_i = y_i]`, :math:`\hat y_i` the first maximal logit (traceable)."""
    m, s, z_y, before = _logit_rows.logit_reductions(logits, labels)
    return TopLabelRows(1.0 / s, (z_y == m) & (before < m))


def rows_from_probs(probs, labels) -> TopLabelRows:
    """Top-label rows of probabilities (:func:`_common.top_label`), the
    confidence in the dtype of ``probs`` (exact: it is one of the entries)."""
    conf, correct = _common.top_label(probs, labels)
    return TopLabelRows(conf.astype(probs.dtype), correct)


def logits_summary(logits, labels, where) -> _checks.ValueSummary:
    """The value checks of logits (:func:`_checks.value_summary`), the row
    finiteness over blocks of rows on the CPU."""
    finite = _logit_rows.by_row_blocks(_logit_rows.finite_rows, logits, labels)
    return _checks.value_summary(logits, labels, where, row_finite=finite)


def softmax(logits):
    """``jax.nn.softmax`` of the float32-upcast logits."""
    return jax.nn.softmax(_common.as_float(logits), axis=-1)


def check_logits_labels(logits, labels, where):
    """Static checks of ``(logits, labels, where)``: float ``[N, K]``, K >= 2,
    N >= 1 (TypeError for integer logits)."""
    return _checks.check_scores_labels(
        logits,
        labels,
        where,
        name="logits",
        purpose="a metric",
        min_classes_hint=_validate.K_HINT,
    )


def check_rows(rows: TopLabelRows, where):
    """Static checks of top-label rows: float ``[N]`` confidence, bool ``[N]``
    correct, N >= 1."""
    conf = _checks.check_floating(rows.confidence, "confidence")
    _checks.check_rank(conf, "confidence", "[N]")
    correct = jnp.asarray(rows.correct)
    if correct.dtype != jnp.bool_:
        raise TypeError(f"correct must be a bool [N] array, got dtype {correct.dtype}.")
    if correct.shape != conf.shape:
        raise ValueError(
            f"correct must have shape [N] = {conf.shape}, as confidence; got "
            f"shape {correct.shape}."
        )
    if conf.shape[0] == 0:
        raise ValueError(
            "confidence is empty (N = 0): a metric needs at least one sample."
        )
    where = _checks.check_where(where, conf.shape[0])
    return TopLabelRows(conf, correct), where


def _rows_summary(rows, where):
    """``(included, bad, first_bad)``: confidences NaN/inf or outside
    ``[0, 1 + tol]`` among the included rows."""
    conf = rows.confidence
    valid = _common.mask_or_ones(where, conf.shape[0])
    tol = _validate.simplex_tolerance(conf.dtype)
    ok = (conf >= 0.0) & (conf <= 1.0 + tol)  # False for NaN
    bad = valid & ~ok
    included, num_bad = _checks.count_true(valid, bad)
    return included, num_bad, jnp.argmax(bad)


def _raise_for_rows(summary, rows):
    included, num_bad, first = (int(v) for v in summary)
    if included == 0:
        raise ValueError(
            "where excludes every row: a metric needs at least one sample."
        )
    if num_bad:
        value = float(rows.confidence[first])
        tol = _validate.simplex_tolerance(rows.confidence.dtype)
        raise ValueError(
            f"confidence must be top-label probabilities in [0, 1] (tolerance "
            f"{tol:.1e}); found {value:.6g} at row {first} ({num_bad} row(s) "
            "NaN, inf or outside)."
        )


@functools.partial(jax.jit, static_argnums=(0, 1, 6))
def _with_summary(core, form, x, labels, where, operands, static):
    out = core(x, labels, where, *operands, *static)
    if form == LOGITS:
        summary = logits_summary(x, labels, where)
    else:
        summary = _rows_summary(x, where)
    return out, summary


def evaluate(core, form, x, labels, where, *static, operands=()):
    """``core(x, labels, where, *operands, *static)`` with the value checks
    of ``form`` (:data:`LOGITS` or :data:`ROWS`) in the same compiled call;
    traced inputs run ``core`` alone, unchecked."""
    if not _checks.is_concrete(*jax.tree.leaves((x, labels, where, operands))):
        return core(x, labels, where, *operands, *static)
    operands = tuple(operands)
    out, summary = _with_summary(core, form, x, labels, where, operands, static)
    summary = _checks.fetch(out, summary)
    if form == LOGITS:
        _checks.raise_for_values(
            _checks.ValueSummary(*summary), x.shape[1], name="logits", family="metric"
        )
    else:
        _raise_for_rows(summary, x)
    return out


def _rows_core(x, labels, where):
    rows = rows_from_logits(x, labels) if labels is not None else x
    return TopLabelRows(_common.as_float(rows.confidence), rows.correct)


def checked(x, labels, where, form):
    """``(x, labels, where)`` of a logits or rows input after the static
    checks (rows: ``labels`` None)."""
    if form == ROWS:
        x, where = check_rows(x, where)
        return x, None, where
    return (*check_logits_labels(x, labels, where),)


def top_label_input(x, labels, where, *, from_logits, metric: str):
    """``(TopLabelRows, where)`` of checked logits or rows, float32
    confidence; None for probabilities (the metric's own path)."""
    form = input_form(x, labels, from_logits=from_logits, metric=metric)
    if form == PROBS:
        return None
    x, labels, where = checked(x, labels, where, form)
    return evaluate(_rows_core, form, x, labels, where), where


def logits_input(x, labels, where, *, from_logits, metric: str):
    """``(logits, labels, where)`` checked statically when ``from_logits``,
    None for probabilities; rows raise (the metric needs ``[N, K]``)."""
    form = input_form(
        x, labels, from_logits=from_logits, metric=metric, top_label=False
    )
    if form == PROBS:
        return None
    return check_logits_labels(x, labels, where)


def top_label_rows(
    x: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    from_logits: bool = False,
    where: jax.typing.ArrayLike | None = None,
) -> TopLabelRows:
    r"""Per-row top-label confidence and correctness, for any top-label metric.

    .. math::

        c_i = \max_k p_{ik}, \qquad a_i = [\hat y_i = y_i],

    with :math:`\hat y_i` the first maximal class (``np.argmax``). From
    logits :math:`c_i = 1/\sum_k e^{z_{ik} - m_i}` and :math:`\hat y_i` the
    first maximal logit (where the two rules differ: ``docs/metrics.md``,
    "Ties"). Jittable and row-wise: run it per shard or chunk, concatenate
    the rows and pass them as ``metric(rows, None)`` (same ``where``);
    ``metric(top_label_rows(probs, labels), None)`` equals
    ``metric(probs, labels)`` bit for bit.

    Args:
      x: float ``[N, K]`` probabilities, or logits with ``from_logits``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      from_logits: static bool, ``x`` holds logits (bf16, fp16 or float32).
      where: optional bool ``[N]``; ``False`` rows are not checked (their
        rows are computed all the same; exclude them with the metric's
        ``where``).

    Returns:
      :class:`TopLabelRows`: ``confidence`` in the dtype of ``probs`` (float32
      from logits) and bool ``correct``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5], [-1.0, 1.0]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> rows = metrics.top_label_rows(logits, labels, from_logits=True)
      >>> print(rows.correct.tolist())
      [True, False, True, True]
      >>> print(f"{float(metrics.ece(rows, None, num_bins=5)):.3f}")
      0.148
    """
    form = input_form(x, labels, from_logits=from_logits, metric="top_label_rows")
    if form == ROWS:
        raise ValueError(
            "top_label_rows takes [N, K] probabilities or logits; got "
            "TopLabelRows already."
        )
    if form == LOGITS:
        x, labels, where = check_logits_labels(x, labels, where)
        return evaluate(_logits_rows, form, x, labels, where)
    probs, labels, where = _validate.check_probs_labels(x, labels, where, values=False)
    return _validate.evaluate(_probs_rows, probs, labels, where)


def _logits_rows(x, labels, where):
    return rows_from_logits(x, labels)


@jax.jit
def _probs_rows(probs, labels, where):
    return rows_from_probs(probs, labels)


def on_probs(rows_fn):
    """``core(probs, labels, where, *args) = rows_fn(conf, correct, where,
    *args)`` on the top-label rows of ``probs`` (:func:`_common.top_label`):
    a probabilities core with the same positional and static arguments."""

    @functools.wraps(rows_fn)
    def core(probs, labels, where, *args):
        conf, correct = _common.top_label(probs, labels)
        return rows_fn(conf, correct, where, *args)

    return core


def _softmax_core(x, labels, where):
    return softmax(x)


def checked_softmax(logits, labels, where):
    """``(softmax(logits), labels, where)`` of checked logits, for a metric
    that reads a column of probabilities of a small ``K`` (``smooth_ece``'s
    ``target='binary'``)."""
    logits, labels, where = check_logits_labels(logits, labels, where)
    return evaluate(_softmax_core, LOGITS, logits, labels, where), labels, where
