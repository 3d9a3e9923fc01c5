"""The losses' input preparation and hyperparameter checks, on top of
:mod:`calib_jax._checks`; value checks run only on concrete (eager) arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax import _checks

# Scalar checks, as the whole library words them.
check_bool = _checks.check_bool
check_nonnegative = _checks.check_nonnegative
check_num_bins = _checks.check_num_bins
check_positive = _checks.check_positive
check_unit_interval = _checks.check_unit_interval

VARIANTS = ("paper", "released_code")


def prepare(logits, labels, where=None):
    """Checks ``(logits, labels, where)``; returns ``logits`` upcast to at least
    float32 ``[B, K]``, int32 ``labels`` and a bool ``mask`` ``[B]`` (NaN/inf
    logits and out-of-range labels raise only for concrete arrays)."""
    logits, labels, where = _checks.check_scores_labels(
        logits, labels, where, name="logits", rows="B"
    )
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    logits = logits.astype(dtype)
    labels = labels.astype(jnp.int32)
    mask = valid_mask(where, logits.shape[0])
    check_values(logits, labels, mask)
    return logits, labels, mask


def check_values(logits, labels, mask) -> None:
    """ValueError for NaN/inf logits or labels outside ``[0, K)`` in an included
    row, only for concrete arrays (tracers under jit pass: no host sync)."""
    _checks.check_values(
        logits, labels, mask, name="logits", family="loss", allow_empty=True
    )


def valid_mask(where, batch_size: int) -> jax.Array:
    """Returns the bool ``[B]`` mask of included rows (all True for None)."""
    if where is None:
        return jnp.ones((batch_size,), dtype=bool)
    return _checks.check_where(where, batch_size, rows="B")


def check_logits(logits) -> jax.Array:
    """Logits-only counterpart of ``prepare``: float ``[B, K]`` upcast to >= f32."""
    logits = _checks.check_floating(logits, "logits")
    _checks.check_rank(logits, "logits", "[B, K]")
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))


def check_open_unit_interval(name: str, value) -> None:
    """Raises ValueError if a concrete value is not strictly inside (0, 1)."""
    _checks.check_unit_interval(name, value, closed_right=False)


def check_at_least_one(name: str, value) -> None:
    """Raises ValueError if a concrete value is < 1 (tracers pass)."""
    v = _checks.concrete_float(value)
    if v is not None and not v >= 1.0:
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
