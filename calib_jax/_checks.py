r"""One checking contract for the array inputs and options of every entry point.

Losses, metrics, post-hoc calibrators and conformal predictors check their
inputs with the functions here; the packages add only what is theirs (the
simplex check of probabilities, ``N > 0`` for fitters, the warnings of a fit
that looks wrong). Three kinds of check:

1. **Static** checks of dtypes, ranks, shapes, masks and options
   (:func:`check_scores_labels`, :func:`check_where`, the scalar checks).
   They read no array value, so they run on every call, also while a caller
   traces under ``jax.jit``/``jax.vmap``, and cost nothing at run time.
2. **Value** checks (NaN/inf in an included row, labels outside ``[0, K)``, a
   mask excluding every row) as a *fused summary*: :func:`value_summary` is
   traceable; the caller computes it inside the same compiled call as its own
   work (one read of the inputs, no extra dispatch), returns it next to the
   result and calls :func:`raise_for_values` on the host afterwards. Under an
   outer ``jax.jit`` the summary is a tracer and nothing is raised
   (:func:`is_concrete`): a traced training or evaluation step never syncs.
3. **Scalar** checks of hyperparameters and options (positive, non-negative,
   unit interval, choice, bin count, positive int, bool). A traced scalar
   passes through unchecked.

Every error is one line that names the argument, its shape or value and the
valid range or names: ``TypeError`` for a wrong dtype or type, ``ValueError``
otherwise. Each kind of error has one wording in every package
(:func:`nonfinite_message`, :func:`label_message`); only the message of a mask
that excludes every row says what needed the rows (``family`` = ``'loss'``,
``'fit'`` or ``'metric'``).
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# ---------------------------------------------------------------------------
# Concreteness
# ---------------------------------------------------------------------------


def is_concrete(*values) -> bool:
    """True when no argument is a JAX tracer (so its values can be inspected).

    ``None`` arguments are ignored.
    """
    return not any(isinstance(v, jax.core.Tracer) for v in values if v is not None)


def concrete_float(value) -> float | None:
    """``value`` as a Python float when it is a concrete scalar, else None.

    Tracers, arrays of rank > 0 and values that do not convert give None.
    """
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, numbers.Number):
        return float(value)
    arr = value if isinstance(value, jax.Array) else np.asarray(value)
    if getattr(arr, "ndim", 1) != 0:
        return None
    try:
        return float(arr)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
        return None


# ---------------------------------------------------------------------------
# Static array checks (dtype, rank, shape, mask)
# ---------------------------------------------------------------------------


def check_floating(x, name: str) -> jax.Array:
    """``x`` as a JAX array; TypeError unless its dtype is floating point."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}.")
    return x


def check_labels_dtype(labels, name: str = "labels") -> jax.Array:
    """``labels`` as a JAX array; TypeError unless its dtype is integer."""
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{name} must be integer class ids, got dtype {labels.dtype}.")
    return labels


_INT32 = np.iinfo(np.int32)


def check_host_labels(labels, num_classes: int, where=None):
    """Range check of labels still on the host, before they become a JAX array.

    JAX holds class ids as int32 (outside 64-bit mode), so a NumPy int64 or
    Python int label outside the int32 range would wrap on conversion
    (``2**32 + 3`` becomes 3) and pass every later check as a valid id. Host
    labels (NumPy arrays, lists, Python ints) of a dtype wider than int32
    are therefore checked here, in both modes: when a value outside the
    int32 range lies in an included row, the first included label outside
    ``[0, K)`` is reported. Labels inside the int32 range are left to the
    fused value check (:func:`value_summary`), so the common case costs one
    ``min``/``max`` over the labels and nothing else; JAX arrays and tracers
    pass through unchanged.

    Args:
      labels: the labels as given by the caller.
      num_classes: ``K``.
      where: the caller's mask (already checked) or None; a traced mask
        counts every row as included.

    Returns:
      ``labels`` as a NumPy array when it was host data, else unchanged.

    Raises:
      ValueError: an included label outside the int32 range (one line naming
        the first included label outside ``[0, K)``, its row and the range).
    """
    if isinstance(labels, (jax.Array, jax.core.Tracer)):
        return labels
    host = np.asarray(labels)
    if host.dtype.kind not in "iu" or host.size == 0:
        return host
    if host.dtype.itemsize < 4 or host.dtype == np.int32:
        return host
    if host.min() >= _INT32.min and host.max() <= _INT32.max:
        return host
    keep = np.ones(host.shape, bool)
    if where is not None and is_concrete(where):
        keep = np.asarray(where, bool).reshape(host.shape)
    flat = host.reshape(-1)
    wide = keep.reshape(-1) & ((flat < _INT32.min) | (flat > _INT32.max))
    if not wide.any():
        return host
    out = keep.reshape(-1) & ((flat < 0) | (flat >= num_classes))
    row = int(np.argmax(out))
    raise ValueError(label_message(num_classes, int(flat[row]), row, int(out.sum())))


def check_rank(x, name: str, shape: str) -> None:
    """ValueError unless ``x.ndim`` matches the shape text (e.g. ``'[N, K]'``)."""
    if x.ndim != shape.count(",") + 1:
        raise ValueError(f"{name} must have shape {shape}, got shape {x.shape}.")


def check_where(where, n: int, *, rows: str = "N"):
    """The bool ``[n]`` mask as a JAX array, or None when ``where`` is None.

    Raises:
      TypeError: a non-bool mask.
      ValueError: a mask of another shape.
    """
    if where is None:
        return None
    where = jnp.asarray(where)
    if where.dtype != jnp.bool_:
        raise TypeError(f"where must be a bool mask, got dtype {where.dtype}.")
    if where.shape != (n,):
        raise ValueError(f"where must have shape [{rows}] = ({n},), got {where.shape}.")
    return where


def check_scores_labels(
    x,
    labels,
    where=None,
    *,
    name: str,
    rows: str = "N",
    purpose: str = "",
    min_classes_hint: str = "",
):
    """Static checks of a float ``[rows, K]`` array, its labels and mask.

    Args:
      x: float ``[N, K]`` (logits or probabilities).
      labels: int ``[N]``.
      where: optional bool ``[N]``.
      name: how ``x`` is called in messages (``'logits'``, ``'probs'``,
        ``'val logits'``).
      rows: the symbol of the leading dimension in messages (``'N'``, ``'B'``).
      purpose: what needs at least one row, e.g. ``'a metric'``; empty means
        that ``N = 0`` is allowed (a loss of an empty batch is 0).
      min_classes_hint: appended to the ``K < 2`` message.

    Returns:
      ``(x, labels, where)`` as JAX arrays (``where`` may stay None).

    Raises:
      TypeError: non-floating ``x``, non-integer labels, non-bool ``where``.
      ValueError: wrong ranks, mismatched lengths, ``K < 2``, ``N = 0``
        when ``purpose`` is given, and host labels outside the int32 range
        (:func:`check_host_labels`).
    """
    x = check_floating(x, name)
    check_rank(x, name, f"[{rows}, K]")
    n, k = x.shape
    if not isinstance(labels, (jax.Array, jax.core.Tracer)):
        labels = np.asarray(labels)  # checked on the host before conversion
    if labels.dtype.kind not in "iu":
        labels = check_labels_dtype(labels)  # the TypeError of a non-integer
    check_rank(labels, "labels", f"[{rows}]")
    if labels.shape[0] != n:
        raise ValueError(
            f"labels must have shape [{rows}] = ({n},), got shape {labels.shape}: "
            f"{name} has {n} rows but labels has {labels.shape[0]} entries (they "
            "disagree on the batch size)."
        )
    if n == 0 and purpose:
        raise ValueError(
            f"{name} is empty (N = 0): {purpose} needs at least one sample."
        )
    if k < 2:
        raise ValueError(
            f"{name} has K = {k} class(es) (shape {x.shape}); at least 2 classes "
            f"(K >= 2) are needed{min_classes_hint}."
        )
    where = check_where(where, n, rows=rows)
    labels = check_host_labels(labels, k, where)
    return x, jnp.asarray(labels), where


# ---------------------------------------------------------------------------
# Value checks as a fused summary
# ---------------------------------------------------------------------------


class ValueSummary(NamedTuple):
    """Scalars that :func:`raise_for_values` turns into one message.

    Attributes:
      included: number of included rows.
      nonfinite: included rows holding NaN or inf.
      first_nonfinite: the first such row (0 when there is none).
      bad_labels: included rows whose label lies outside ``[0, K)``.
      first_bad_label: the first such row (0 when there is none).
      bad_label: the label of that row.
    """

    included: jax.Array
    nonfinite: jax.Array
    first_nonfinite: jax.Array
    bad_labels: jax.Array
    first_bad_label: jax.Array
    bad_label: jax.Array


def count_true(*masks: jax.Array) -> tuple[jax.Array, ...]:
    """The number of True entries of each bool ``[N]`` mask (traceable).

    One variadic reduction for all masks: on XLA:CPU each separate
    ``jnp.sum`` over ``N`` rows compiles to its own tree of reductions, so
    three counts summed apart cost about 3x the compile time and 4x the run
    time of this single loop (``benchmarks/RESULTS.md``).

    Returns:
      A tuple of int32 scalars, one per mask.
    """
    ops = tuple(m.astype(jnp.int32) for m in masks)
    zeros = tuple(jnp.zeros((), jnp.int32) for _ in ops)
    return tuple(
        lax.reduce(ops, zeros, lambda a, b: tuple(x + y for x, y in zip(a, b)), (0,))
    )


def value_summary(x, labels, where=None, *, row_finite=None) -> ValueSummary:
    """The value checks of ``(x, labels, where)`` as a few scalars (traceable).

    Computed inside the caller's own compiled call, it shares that call's
    read of ``x``; nothing here syncs with the host.

    Args:
      x: float ``[N, K]``.
      labels: int ``[N]``.
      where: bool ``[N]`` or None (every row).
      row_finite: optional bool ``[N]``, whether each row is finite, when the
        caller has a cheaper way to know it (e.g. from row sums or a
        log-sum-exp it computes anyway); default ``all(isfinite(x), axis=1)``.

    Returns:
      A :class:`ValueSummary` of scalars.
    """
    keep = jnp.ones(labels.shape, bool) if where is None else where
    if row_finite is None:
        row_finite = jnp.all(jnp.isfinite(x), axis=1)
    bad = keep & ~row_finite
    out = keep & ((labels < 0) | (labels >= x.shape[1]))
    first_out = jnp.argmax(out)
    included, num_bad, num_out = count_true(keep, bad, out)
    return ValueSummary(
        included,
        num_bad,
        jnp.argmax(bad),
        num_out,
        first_out,
        labels[first_out] if labels.shape[0] else jnp.zeros((), labels.dtype),
    )


_NO_ROWS = {
    "loss": "where excludes every row.",
    "fit": "where excludes every row: fitting needs at least one sample.",
    "metric": "where excludes every row: a metric needs at least one sample.",
}


def nonfinite_message(name: str, count: int, first: int) -> str:
    """The one-line message for ``count`` NaN/inf rows, first at ``first``."""
    return f"{name} contains NaN or inf in {count} row(s) (first: row {first})."


def label_message(k: int, label: int, row: int, count: int) -> str:
    """The one-line message for ``count`` labels outside ``[0, k)``."""
    return (
        f"labels must lie in [0, K) = [0, {k}); found {label} at row {row} "
        f"({count} label(s) out of range)."
    )


def raise_for_values(
    summary: ValueSummary,
    num_classes: int,
    *,
    name: str = "logits",
    family: str = "fit",
    allow_empty: bool = False,
) -> None:
    """Raises the one-line ValueError a :class:`ValueSummary` calls for.

    Does nothing when the summary is a tracer (the caller is being traced).
    The order of the checks: no included row, NaN/inf, labels out of range.

    Args:
      summary: the output of :func:`value_summary` (fetched here).
      num_classes: ``K``.
      name: how ``x`` is called in the messages.
      family: ``'loss'``, ``'fit'`` or ``'metric'``: what needed the rows, in
        the message of a mask that excludes every row.
      allow_empty: whether no included row is fine (losses: a zero loss).
    """
    if not is_concrete(*summary):
        return
    s = ValueSummary(*(int(v) for v in jax.device_get(tuple(summary))))
    if s.included == 0:
        if allow_empty:
            return
        raise ValueError(_NO_ROWS[family])
    if s.nonfinite:
        raise ValueError(nonfinite_message(name, s.nonfinite, s.first_nonfinite))
    if s.bad_labels:
        raise ValueError(
            label_message(num_classes, s.bad_label, s.first_bad_label, s.bad_labels)
        )


def fetch(result, summary):
    """Moves ``result`` and its value ``summary`` to the host in one transfer.

    Returns the host ``summary``. ``result`` stays as it is, but a fetched
    ``jax.Array`` keeps its host copy, so the caller's later ``float(result)``
    or ``np.asarray(result)`` reads it without a second device-to-host
    round trip (``tests/test_transfers.py``): one synchronising transfer for
    an eager call whose compiled call computes its own value checks.
    """
    return jax.device_get((result, summary))[1]


_value_summary_jit = jax.jit(value_summary)


@functools.partial(jax.jit, static_argnums=1)
def _label_summary(labels, num_classes, where):
    keep = jnp.ones(labels.shape, bool) if where is None else where
    out = keep & ((labels < 0) | (labels >= num_classes))
    first = jnp.argmax(out)
    return count_true(out)[0], first, labels[first]


def check_label_values(labels, num_classes: int, where=None) -> None:
    """ValueError when a concrete included label lies outside ``[0, K)``.

    For callers that read labels without scores to summarise next to them
    (the scores of prediction sets): a gather at an out-of-range label
    clamps, so it must not reach one. Traced inputs are not checked.
    """
    if not is_concrete(labels, where) or labels.shape[0] == 0:
        return
    count, row, label = (
        int(v) for v in jax.device_get(_label_summary(labels, num_classes, where))
    )
    if count:
        raise ValueError(label_message(num_classes, label, row, count))


def check_values(
    x,
    labels,
    where=None,
    *,
    name: str = "logits",
    family: str = "fit",
    allow_empty: bool = False,
) -> None:
    """Value checks as a compiled call of their own, for concrete inputs only.

    For callers that do not compute :func:`value_summary` inside their own
    compiled call (host code, small inputs). Traced inputs are not checked.
    """
    if not is_concrete(x, labels, where) or x.shape[0] == 0:
        return
    raise_for_values(
        _value_summary_jit(x, labels, where),
        x.shape[1],
        name=name,
        family=family,
        allow_empty=allow_empty,
    )


# ---------------------------------------------------------------------------
# Scalar checks (hyperparameters and options)
# ---------------------------------------------------------------------------


def check_positive(name: str, value):
    """Returns ``value``; ValueError if it is a concrete scalar not > 0 (NaN too)."""
    v = concrete_float(value)
    if v is not None and not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}.")
    return value


def check_nonnegative(name: str, value):
    """Returns ``value``; ValueError if it is a concrete scalar not >= 0 (NaN too)."""
    v = concrete_float(value)
    if v is not None and not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {v}.")
    return value


def check_unit_interval(
    name: str, value, *, closed_left: bool = False, closed_right: bool = True
):
    """Returns ``value``; ValueError if a concrete scalar lies outside the
    unit interval (``(0, 1]`` by default; the ends as the flags say)."""
    v = concrete_float(value)
    if v is None:
        return value
    above = (0.0 <= v) if closed_left else (0.0 < v)
    below = (v <= 1.0) if closed_right else (v < 1.0)
    if not (above and below):
        interval = (
            ("[" if closed_left else "(") + "0, 1" + ("]" if closed_right else ")")
        )
        raise ValueError(f"{name} must lie in {interval}, got {v}.")
    return value


def check_choice(name: str, value, allowed):
    """Returns ``value``; ValueError unless it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}.")
    return value


def check_num_bins(num_bins) -> int:
    """``num_bins`` as int; ValueError unless it is an int >= 1.

    A ValueError (not TypeError) for a non-int too, so that every bad bin
    count raises the same.
    """
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
        raise ValueError(f"num_bins must be a Python int >= 1, got {num_bins!r}.")  # noqa: TRY004
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}.")
    return int(num_bins)


def check_int(name: str, value, *, minimum: int = 1) -> int:
    """``value`` as int; TypeError for a non-int, ValueError below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a Python int >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return int(value)


def check_positive_int(name: str, value) -> int:
    """``value`` as int; TypeError for a non-int, ValueError unless >= 1."""
    return check_int(name, value, minimum=1)


def check_bool(name: str, value) -> bool:
    """A static switch (Python or NumPy bool) as bool; ValueError otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        # ValueError as the losses have always raised for a bad switch.
        raise ValueError(f"{name} must be True or False, got {value!r}.")  # noqa: TRY004
    return bool(value)


def check_multilabel(
    x,
    labels,
    where=None,
    *,
    name: str = "logits",
    purpose: str = "multi-label calibration",
):
    """Static checks of multi-label scores ``[N, L]``, targets and row mask.

    Args:
      x: float ``[N, L]`` logits or probabilities.
      labels: bool, integer or float ``[N, L]`` 0/1 targets.
      where: optional bool ``[N]`` row mask.
      name: how ``x`` is called in messages.
      purpose: what needs the rows, in the message of an empty ``x``.

    Returns:
      ``(x, labels, where)`` as JAX arrays (``where`` may stay None).

    Raises:
      TypeError: non-floating ``x``, labels that are not bool, integer or
        float, a non-bool ``where``.
      ValueError: ``x`` not of rank 2, ``N = 0`` or ``L = 0``, labels of
        another shape than ``x``, a mask of another length.
    """
    x = check_floating(x, name)
    check_rank(x, name, "[N, L]")
    n, num_labels = x.shape
    if n == 0 or num_labels == 0:
        raise ValueError(
            f"{name} is empty (shape {x.shape}): {purpose} needs N >= 1 rows and "
            "L >= 1 labels."
        )
    where = check_where(where, n)
    labels = jnp.asarray(host_binary_targets(labels, where))
    if not (
        labels.dtype == jnp.bool_
        or jnp.issubdtype(labels.dtype, jnp.integer)
        or jnp.issubdtype(labels.dtype, jnp.floating)
    ):
        raise TypeError(
            f"labels must be bool, integer or float 0/1 targets, got dtype "
            f"{labels.dtype}."
        )
    if labels.shape != x.shape:
        raise ValueError(
            f"labels must have the shape of {name}, [N, L] = {x.shape} (one 0/1 "
            f"target per row and label), got shape {labels.shape}."
        )
    return x, labels, where


def host_binary_targets(labels, where):
    """Host labels of a dtype wider than 32 bits, checked before they become
    a JAX array: outside 64-bit mode the conversion would wrap an int64
    ``2**32 + 1`` to 1, or round a float64 ``1 + 1e-12`` to 1.0, and the
    value check would pass them. Other labels pass through unchanged."""
    if isinstance(labels, (jax.Array, jax.core.Tracer)):
        return labels
    host = np.asarray(labels)
    if host.dtype.itemsize <= 4 or host.dtype.kind not in "iuf" or host.ndim != 2:
        return host
    keep = np.ones(host.shape[0], bool)
    if where is not None and is_concrete(where):
        if where.shape[0] != host.shape[0]:
            return host  # the shape check that follows explains it
        keep = np.asarray(where, bool)
    bad = keep[:, None] & (host != 0) & (host != 1)
    if bad.any():
        row, label = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"labels must be 0 or 1 (one binary target per row and label); found "
            f"{host[row, label].item()!r} at row {row}, label {label} "
            f"({int(bad.sum())} target(s) not 0/1)."
        )
    return host.astype(np.int32 if host.dtype.kind in "iu" else np.float32)
