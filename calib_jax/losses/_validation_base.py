"""Validation base of the losses: input preparation and hyperparameter checks.

Everything here runs at trace time on static information (dtypes, shapes,
concrete Python hyperparameters) and adds nothing to the compiled computation
beyond the upcast and the mask; the value checks of :func:`check_values` run
only on concrete (eager) arrays. Each loss checks its own hyperparameters with
the helpers below, so a hyperparameter's domain is written once, in the loss;
the composition (``_compose``) finds it by evaluating the loss abstractly.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

VARIANTS = ("paper", "released_code")

# ---------------------------------------------------------------------------
# Arrays.
# ---------------------------------------------------------------------------


def prepare(logits, labels, where=None):
    """Checks and canonicalises ``(logits, labels, where)`` of a loss call.

    Args:
      logits: float ``[B, K]``; bf16/fp16 are upcast to float32.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are excluded.

    Returns:
      ``(logits32, labels, mask)`` with ``logits32`` float32 (or float64 when
      the input is float64) ``[B, K]``, ``labels`` int32 ``[B]`` and ``mask``
      bool ``[B]`` (all True when ``where`` is None).

    Raises:
      TypeError: non-floating logits, non-integer labels or non-bool ``where``.
      ValueError: wrong ranks, fewer than 2 classes or mismatched batch
        sizes; for concrete
        (non-traced) arrays also NaN/inf logits or labels out of range in an
        included row (:func:`check_values`).
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"logits must be floating point, got dtype {logits.dtype}.")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integer class ids, got dtype {labels.dtype}.")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape [B, K], got shape {logits.shape}.")
    if labels.ndim != 1:
        raise ValueError(f"labels must have shape [B], got shape {labels.shape}.")
    if logits.shape[1] < 2:
        raise ValueError(
            f"logits must have at least 2 classes (K >= 2), got shape {logits.shape}."
        )
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(
            f"logits and labels disagree on the batch size: logits {logits.shape}, "
            f"labels {labels.shape}."
        )
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    logits = logits.astype(dtype)
    labels = labels.astype(jnp.int32)
    mask = valid_mask(where, logits.shape[0])
    check_values(logits, labels, mask)
    return logits, labels, mask


def check_values(logits, labels, mask) -> None:
    """Host-side value checks of a loss call, only when the arrays are concrete.

    Eager (host-facing) calls get a one-line ValueError for NaN/inf logits or
    labels outside ``[0, K)`` in an included row, instead of a silent NaN or a
    clipped gather. Under ``jax.jit`` or ``jax.grad`` the inputs are tracers
    and nothing is checked: the jitted training step pays no host sync.

    Raises:
      ValueError: naming the first offending row and how many rows are bad.
    """
    if any(isinstance(a, jax.core.Tracer) for a in (logits, labels, mask)):
        return
    if logits.shape[0] == 0:
        return
    m = np.asarray(mask)
    k = logits.shape[-1]
    lab = np.asarray(labels)
    bad = m & ((lab < 0) | (lab >= k))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"labels must lie in [0, K) = [0, {k}); found {int(lab[i])} at row {i} "
            f"({int(bad.sum())} row(s) out of range)."
        )
    finite = np.asarray(jnp.all(jnp.isfinite(logits), axis=-1))
    bad = m & ~finite
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"logits contain NaN/inf in {int(bad.sum())} row(s) (first: row {i})."
        )


def valid_mask(where, batch_size: int) -> jax.Array:
    """Returns the bool ``[B]`` mask of included rows (all True for None)."""
    if where is None:
        return jnp.ones((batch_size,), dtype=bool)
    where = jnp.asarray(where)
    if where.dtype != jnp.bool_:
        raise TypeError(f"where must be a bool mask, got dtype {where.dtype}.")
    if where.shape != (batch_size,):
        raise ValueError(
            f"where must have shape [B] = ({batch_size},), got {where.shape}."
        )
    return where


def check_logits(logits) -> jax.Array:
    """Logits-only counterpart of ``prepare``: float ``[B, K]`` upcast to >= f32."""
    logits = jnp.asarray(logits)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"logits must be floating point, got dtype {logits.dtype}.")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape [B, K], got shape {logits.shape}.")
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))


# ---------------------------------------------------------------------------
# Scalar hyperparameters (concrete values are checked; tracers pass).
# ---------------------------------------------------------------------------


def _concrete(value):
    """Returns ``value`` as a float when it is a concrete scalar, else None."""
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, numbers.Number):
        return float(value)
    arr = np.asarray(value) if not isinstance(value, jax.Array) else value
    if getattr(arr, "ndim", 1) != 0:
        return None
    try:
        return float(arr)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def check_positive(name: str, value) -> None:
    """Raises ValueError if a concrete hyperparameter is not > 0 (tracers pass)."""
    v = _concrete(value)
    if v is not None and not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}.")


def check_nonnegative(name: str, value) -> None:
    """Raises ValueError if a concrete hyperparameter is < 0 (tracers pass)."""
    v = _concrete(value)
    if v is not None and not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {v}.")


def check_bool(name: str, value) -> bool:
    """Validates a static switch (Python or NumPy bool) and returns it as bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_num_bins(num_bins) -> int:
    """Validates the static bin count and returns it as an int."""
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
        raise ValueError(f"num_bins must be a Python int >= 1, got {num_bins!r}.")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}.")
    return int(num_bins)


def check_unit_interval(name: str, value, *, closed_left: bool = False) -> None:
    """Raises ValueError if a concrete value lies outside (0, 1] (or [0, 1])."""
    v = _concrete(value)
    if v is None:
        return
    ok = (0.0 <= v <= 1.0) if closed_left else (0.0 < v <= 1.0)
    if not ok:
        interval = "[0, 1]" if closed_left else "(0, 1]"
        raise ValueError(f"{name} must lie in {interval}, got {v}.")


def check_open_unit_interval(name: str, value) -> None:
    """Raises ValueError if a concrete value is not strictly inside (0, 1)."""
    check_unit_interval(name, value)
    if isinstance(value, jax.core.Tracer):
        return
    try:
        v = float(value)
    except (TypeError, ValueError):
        return
    if v >= 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {v}.")


def check_at_least_one(name: str, value) -> None:
    """Raises ValueError if a concrete value is < 1 (tracers pass)."""
    if isinstance(value, jax.core.Tracer):
        return
    try:
        v = float(value)
    except (TypeError, ValueError):
        return
    if not v >= 1.0:
        raise ValueError(f"{name} must be >= 1, got {v}.")


def check_variant(variant, valid=VARIANTS) -> str:
    """Returns ``variant`` or raises ValueError listing the valid ones."""
    if not isinstance(variant, str) or variant not in valid:
        raise ValueError(
            f"Unknown variant={variant!r}; valid: {', '.join(repr(v) for v in valid)}."
        )
    return variant


def reject(fn: str, option: str) -> None:
    """One-line error for an option the released code does not have."""
    raise ValueError(
        f"{fn}(variant='released_code') does not support {option}: the released "
        f"code has no such option."
    )
