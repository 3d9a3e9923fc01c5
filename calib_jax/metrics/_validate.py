r"""The metrics' input checks: static ones always, value ones only on concrete arrays,
fused into the metric's compiled call (:func:`evaluate`); a failed screen is worded
by the exact :func:`explain` (``docs/metrics.md``, "Inputs, checks and jit")."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks
from calib_jax.metrics import _common

SIMPLEX_ATOL = 1e-3


K_HINT = " (for one probability per row use [1 - p, p] or BinnedStats.from_confidences)"


def simplex_tolerance(dtype) -> float:
    """Allowed ``|row sum - 1|``: ``max(1e-3, eps(dtype))`` (bf16 rows pass)."""
    return max(SIMPLEX_ATOL, float(jnp.finfo(dtype).eps))


def check_p(p, allowed=(1, 2)) -> float:
    """Returns the norm order as float; ValueError when not allowed."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p must be one of {allowed}, got {p!r}.") from None
    if value not in [float(a) for a in allowed]:
        raise ValueError(f"p must be one of {allowed}, got {p!r}.")
    return value


def check_probs_labels(probs, labels, where=None, *, values: bool = True):
    """Checked ``(probs, labels, where)``; with ``values`` (False from
    :func:`evaluate`, which checks in the metric's call) and concrete inputs,
    the value checks too."""
    probs, labels, where = _checks.check_scores_labels(
        probs,
        labels,
        where,
        name="probs",
        purpose="a metric",
        min_classes_hint=K_HINT,
    )
    if values and _checks.is_concrete(probs, labels, where):
        raise_for_summary(_summary_jit(probs, labels, where), probs, labels, where)
    return probs, labels, where


def probs_summary(probs, labels, where, sums=None):
    """``(included, suspect, bad_labels)`` counts: suspect rows have an entry below
    0, NaN/inf, or a row sum off 1 by more than the tolerance minus a margin.
    ``sums``: the metric's own screened row sums, if it has them (traceable)."""
    n, k = probs.shape
    valid = jnp.ones((n,), bool) if where is None else where
    x = _common.as_float(probs)
    tol = simplex_tolerance(probs.dtype)
    screen = tol - min(2.0 * k * float(jnp.finfo(x.dtype).eps), 0.5 * tol)
    if sums is None:
        # top_label's fused (key, sum) reduction: a row sum of the screened
        # values alone does not vectorise on XLA:CPU.
        conf, _, sums = _common.top_label(x, labels, screen=True)
        sums = jnp.where(conf <= 1.0 + tol, sums, jnp.nan)
    # An entry below 0, NaN or inf makes the row sum NaN or huge; an entry
    # above 1 + tol makes it exceed 1 + tol (the others are >= 0).
    ok = jnp.abs(sums - 1.0) <= screen
    bad_label = valid & ((labels < 0) | (labels >= k))
    return _checks.count_true(valid, valid & ~ok, bad_label)


_summary_jit = jax.jit(probs_summary)


def raise_for_summary(summary, probs, labels, where) -> None:
    """Raises the one-line ValueError that a :func:`probs_summary` calls for
    (:func:`explain` may find nothing: the screen's margin is conservative)."""
    included, suspect, bad_labels = (int(v) for v in jax.device_get(summary))
    if included == 0:
        raise ValueError(
            "where excludes every row: a metric needs at least one sample."
        )
    if suspect or bad_labels:
        explain(probs, labels, where)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _explain_summary(probs, labels, where, num_classes):
    """The exact counts and extremes that :func:`explain` turns into messages."""
    valid = jnp.ones(labels.shape, bool) if where is None else where
    x = probs.astype(jnp.promote_types(probs.dtype, jnp.float32))
    finite_rows = jnp.all(jnp.isfinite(x), axis=1)
    nonfinite = jnp.sum(valid & ~finite_rows)
    rows_ok = valid & finite_rows
    low = jnp.min(jnp.where(rows_ok[:, None], x, 0.0))
    high = jnp.max(jnp.where(rows_ok[:, None], x, 0.0))
    err = jnp.where(rows_ok, jnp.abs(jnp.sum(x, axis=1) - 1.0), 0.0)
    worst = jnp.argmax(err)
    bad_label = valid & ((labels < 0) | (labels >= num_classes))
    return (
        nonfinite,
        jnp.argmax(valid & ~finite_rows),
        low,
        high,
        err[worst],
        worst,
        jnp.sum(x[worst]),
        jnp.sum(bad_label),
        jnp.argmax(bad_label),
    )


def explain(probs, labels, where) -> None:
    """Raises the ValueError for the first problem of concrete inputs, if any:
    NaN/inf, entries outside ``[0, 1 + tol]``, rows off the simplex, labels."""
    k = probs.shape[1]
    out = jax.device_get(_explain_summary(probs, labels, where, k))
    nonfinite, first_nonfinite, low, high, err, worst, worst_sum, n_bad, first_bad = out
    if int(nonfinite):
        raise ValueError(
            _checks.nonfinite_message("probs", int(nonfinite), int(first_nonfinite))
        )
    tol = simplex_tolerance(probs.dtype)
    hint = (
        " If these are logits, pass from_logits=True (or jax.nn.softmax(logits,"
        " axis=-1))."
    )
    if float(low) < 0.0 or float(high) > 1.0 + tol:
        raise ValueError(
            f"probs must be probabilities in [0, 1]; found values in "
            f"[{float(low):.4g}, {float(high):.4g}].{hint}"
        )
    if float(err) > tol:
        raise ValueError(
            f"rows of probs must sum to 1 (tolerance {tol:.1e}); row {int(worst)} "
            f"sums to {float(worst_sum):.6g}.{hint}"
        )
    if int(n_bad):
        bad = int(np.asarray(labels)[int(first_bad)])
        raise ValueError(_checks.label_message(k, bad, int(first_bad), int(n_bad)))


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _with_summary(core, probs, labels, where, operands, static, screened):
    args = (probs, labels, where, *operands, *static)
    out, sums = core(*args, True) if screened else (core(*args), None)
    return out, probs_summary(probs, labels, where, sums)


def evaluate(core, probs, labels, where, *static, screened=False, operands=()):
    """``core(probs, labels, where, *operands, *static)``, with concrete inputs
    checked in the same program (``screened``: ``core`` takes a last static
    ``screen`` flag and returns ``(value, row sums or None)``)."""
    if not _checks.is_concrete(probs, labels, where, *operands):
        return core(probs, labels, where, *operands, *static)
    operands = tuple(operands)
    out, summary = _with_summary(core, probs, labels, where, operands, static, screened)
    raise_for_summary(_checks.fetch(out, summary), probs, labels, where)
    return out


def check_scores(scores, where=None, *, name: str = "scores"):
    """Checks a float ``[N]`` score vector (finite, N > 0) and its mask."""
    scores = _checks.check_floating(scores, name)
    _checks.check_rank(scores, name, "[N]")
    if scores.shape[0] == 0:
        raise ValueError(
            f"{name} is empty (N = 0): a metric needs at least one sample."
        )
    where = _checks.check_where(where, scores.shape[0])
    if _checks.is_concrete(scores, where):
        bad, first, included = jax.device_get(_score_summary(scores, where))
        if included == 0:
            raise ValueError(
                "where excludes every row: a metric needs at least one sample."
            )
        if bad:
            raise ValueError(_checks.nonfinite_message(name, bad, first))
    return scores, where


@jax.jit
def _score_summary(scores, where):
    valid = jnp.ones(scores.shape, bool) if where is None else where
    bad = valid & ~jnp.isfinite(scores)
    return jnp.sum(bad), jnp.argmax(bad), jnp.sum(valid)
