r"""Input checks of the public metric functions.

Two layers:

- *static* checks (ranks, shapes, dtypes, option values) run whenever a
  metric is called, also while it is being traced under ``jax.jit``;
- *value* checks (NaN/inf, rows off the probability simplex, labels out of
  range, no included row) run only when the arrays are concrete, i.e. in
  eager host code. Under ``jax.jit`` the inputs are tracers and the value
  checks are skipped: the jitted cores never inspect values, so the same
  function works in a traced training or eval step without host syncs.

Logits are not accepted: a row must lie on the probability simplex, every
entry in ``[0, 1 + tol]`` and the row summing to 1 within
``tol = max(1e-3, eps(dtype))`` (``eps`` is 2**-7 for bfloat16, so bf16
probabilities pass). Apply ``jax.nn.softmax(logits, axis=-1)`` first.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

SIMPLEX_ATOL = 1e-3


def is_concrete(*arrays) -> bool:
    """True when no argument is a JAX tracer (so values can be inspected)."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays if a is not None)


def simplex_tolerance(dtype) -> float:
    """Allowed ``|row sum - 1|`` for probabilities of ``dtype``."""
    return max(SIMPLEX_ATOL, float(jnp.finfo(dtype).eps))


def check_num_bins(num_bins) -> int:
    """Returns ``num_bins`` as int; ValueError unless it is an int >= 1."""
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
        # ValueError (not TypeError) so every bad num_bins raises the same.
        raise ValueError(f"num_bins must be a Python int >= 1, got {num_bins!r}.")  # noqa: TRY004
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}.")
    return int(num_bins)


def check_choice(name: str, value, allowed) -> None:
    """ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}.")


def check_p(p, allowed=(1, 2)) -> float:
    """Returns the norm order as float; ValueError when not allowed."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p must be one of {allowed}, got {p!r}.") from None
    if value not in [float(a) for a in allowed]:
        raise ValueError(f"p must be one of {allowed}, got {p!r}.")
    return value


def _check_where(where, n: int):
    if where is None:
        return None
    where = jnp.asarray(where)
    if where.dtype != jnp.bool_:
        raise TypeError(f"where must be a bool mask, got dtype {where.dtype}.")
    if where.shape != (n,):
        raise ValueError(f"where must have shape [N] = ({n},), got {where.shape}.")
    return where


def check_probs_labels(probs, labels, where=None):
    """Static and (when concrete) value checks of ``(probs, labels, where)``.

    Args:
      probs: float ``[N, K]`` probabilities (rows on the simplex).
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are excluded and not checked.

    Returns:
      ``(probs, labels, where)`` as JAX arrays (``where`` may stay None).

    Raises:
      TypeError: non-floating probs, non-integer labels, non-bool where.
      ValueError: bad shapes, N = 0, K < 2, and for concrete inputs NaN/inf, rows off
        the simplex, labels out of range or a mask excluding every row.
    """
    probs = jnp.asarray(probs)
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(probs.dtype, jnp.floating):
        raise TypeError(f"probs must be floating point, got dtype {probs.dtype}.")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integer class ids, got dtype {labels.dtype}.")
    if probs.ndim != 2:
        raise ValueError(f"probs must have shape [N, K], got shape {probs.shape}.")
    if labels.ndim != 1 or labels.shape[0] != probs.shape[0]:
        raise ValueError(
            f"labels must have shape [N] = ({probs.shape[0]},), got {labels.shape}."
        )
    n, k = probs.shape
    if n == 0:
        raise ValueError("probs is empty (N = 0): a metric needs at least one sample.")
    if k < 2:
        raise ValueError(
            f"probs has K = {k} class(es); calibration metrics need K >= 2 (for "
            "one probability per row use [1 - p, p] or "
            "BinnedStats.from_confidences)."
        )
    where = _check_where(where, n)
    if is_concrete(probs, labels, where):
        _check_values(probs, labels, where)
    return probs, labels, where


def check_scores(scores, where=None, *, name: str = "scores"):
    """Checks a float ``[N]`` score vector (finite, N > 0) and its mask."""
    scores = jnp.asarray(scores)
    if not jnp.issubdtype(scores.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating point, got dtype {scores.dtype}.")
    if scores.ndim != 1:
        raise ValueError(f"{name} must have shape [N], got shape {scores.shape}.")
    if scores.shape[0] == 0:
        raise ValueError(f"{name} is empty (N = 0).")
    where = _check_where(where, scores.shape[0])
    if is_concrete(scores, where):
        bad, included = (int(v) for v in _score_summary(scores, where))
        if included == 0:
            raise ValueError(f"where excludes every row of {name}.")
        if bad:
            raise ValueError(f"{name} contains {bad} NaN/inf value(s).")
    return scores, where


@jax.jit
def _score_summary(scores, where):
    valid = jnp.ones(scores.shape, bool) if where is None else where
    bad = jnp.sum(valid & ~jnp.isfinite(scores))
    return bad, jnp.sum(valid)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _summary(probs, labels, where, num_classes):
    """One fused pass: counts and extremes that the host turns into messages."""
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
        jnp.sum(valid),
        nonfinite,
        low,
        high,
        err[worst],
        worst,
        jnp.sum(x[worst]),
        jnp.sum(bad_label),
        jnp.argmax(bad_label),
    )


def _check_values(probs, labels, where) -> None:
    k = probs.shape[1]
    out = jax.device_get(_summary(probs, labels, where, k))
    included, nonfinite, low, high, err, worst, worst_sum, n_bad, first_bad = out
    if int(included) == 0:
        raise ValueError(
            "where excludes every row: a metric needs at least one sample."
        )
    if int(nonfinite):
        raise ValueError(f"probs contains NaN or inf in {int(nonfinite)} row(s).")
    tol = simplex_tolerance(probs.dtype)
    hint = " If these are logits, pass jax.nn.softmax(logits, axis=-1)."
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
        raise ValueError(
            f"labels must lie in [0, {k}); {int(n_bad)} label(s) out of range, "
            f"e.g. labels[{int(first_bad)}] = {bad}."
        )
