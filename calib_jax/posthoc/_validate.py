"""Host-side input checks of the post-hoc entry points.

Static checks (ranks, shapes, dtypes, ``N >= 1``, ``K >= 2``) run on every
call, also while tracing under ``jax.jit``/``jax.vmap``. Value checks (NaN/inf
logits, labels out of range, a mask excluding every row, non-positive
temperatures) run only on concrete arrays, i.e. in eager host code; the
jitted cores never inspect values. Every message is one line.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*arrays) -> bool:
    """True when no argument is a JAX tracer."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays if a is not None)


def check_inputs(logits, labels, where=None, *, name: str = "logits"):
    """Checks ``(logits [N, K], labels [N], where [N] | None)``.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are excluded and not
        value-checked.
      name: how ``logits`` is called in messages (e.g. ``'val logits'``).

    Returns:
      ``(logits, labels, where)`` as JAX arrays (``where`` may stay None).

    Raises:
      TypeError: non-floating logits, non-integer labels, non-bool ``where``.
      ValueError: wrong ranks, ``N = 0``, ``K < 2``, mismatched lengths and,
        for concrete inputs, NaN/inf logits, labels out of range or a mask
        excluding every row.
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating point, got dtype {logits.dtype}.")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integer class ids, got dtype {labels.dtype}.")
    if logits.ndim != 2:
        raise ValueError(f"{name} must have shape [N, K], got shape {logits.shape}.")
    if labels.ndim != 1:
        raise ValueError(f"labels must have shape [N], got shape {labels.shape}.")
    n, k = logits.shape
    if labels.shape[0] != n:
        raise ValueError(
            f"{name} has {n} rows but labels has {labels.shape[0]} entries."
        )
    if n == 0:
        raise ValueError(f"{name} is empty (N = 0): fitting needs at least one sample.")
    if k < 2:
        raise ValueError(f"{name} has K = {k} class(es): calibration needs K >= 2.")
    if where is not None:
        where = jnp.asarray(where)
        if where.dtype != jnp.bool_:
            raise TypeError(f"where must be a bool mask, got dtype {where.dtype}.")
        if where.shape != (n,):
            raise ValueError(f"where must have shape [N] = ({n},), got {where.shape}.")
    if is_concrete(logits, labels, where):
        _check_values(logits, labels, where, name)
    return logits, labels, where


def _check_values(logits, labels, where, name):
    x = np.asarray(logits)
    y = np.asarray(labels)
    keep = np.ones(y.shape, bool) if where is None else np.asarray(where)
    if not keep.any():
        raise ValueError("where excludes every row: fitting needs at least one sample.")
    bad_rows = keep & ~np.isfinite(x).all(axis=1)
    if bad_rows.any():
        first = int(np.argmax(bad_rows))
        raise ValueError(
            f"{name} contain NaN/inf values in {int(bad_rows.sum())} row(s) "
            f"(first at row {first})."
        )
    k = x.shape[1]
    out = keep & ((y < 0) | (y >= k))
    if out.any():
        first = int(np.argmax(out))
        raise ValueError(
            f"labels must lie in [0, K) = [0, {k}); found {int(y[first])} at row "
            f"{first} ({int(out.sum())} out of range)."
        )


def check_temperature(t, *, name: str = "temperature"):
    """ValueError unless a concrete temperature is finite and > 0 everywhere."""
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating) and not jnp.issubdtype(
        t.dtype, jnp.integer
    ):
        raise TypeError(f"{name} must be a real number, got dtype {t.dtype}.")
    if is_concrete(t):
        v = np.asarray(t, dtype=np.float64)
        if not (np.isfinite(v).all() and (v > 0).all()):
            bad = v[~(np.isfinite(v) & (v > 0))].ravel()[0]
            raise ValueError(f"{name} must be finite and > 0, got {bad}.")
    return t


def check_positive_int(name: str, value) -> int:
    """Returns ``value`` as int; ValueError unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int >= 1, got {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")
    return int(value)


def check_choice(name: str, value, allowed) -> None:
    """ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}.")


def check_nonnegative(name: str, value) -> float:
    """Returns a concrete ``value >= 0`` as float (tracers pass through)."""
    if isinstance(value, jax.core.Tracer):
        return value
    v = float(value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {v}.")
    return v
