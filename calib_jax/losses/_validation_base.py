"""Validation base of the losses: input preparation and hyperparameter checks.

The generic checks (dtypes, ranks, shapes, masks, value checks, scalar
checks) are those of :mod:`calib_jax._checks`, the library's one checking
contract; this module adds what is the losses' own: the ``[B, K]`` upcast to
at least float32 with int32 labels and a mask, the variant checks and the
norm-order check. Everything here runs at trace time on static information
(dtypes, shapes, concrete Python hyperparameters) and adds nothing to the
compiled computation beyond the upcast and the mask; the value checks run only
on concrete (eager) arrays. Each loss checks its own hyperparameters with the
helpers below, so a hyperparameter's domain is written once, in the loss; the
composition (``_compose``) finds it by evaluating the loss abstractly.
"""

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
    """Host-side value checks of a loss call, only when the arrays are concrete.

    Eager (host-facing) calls get a one-line ValueError for NaN/inf logits or
    labels outside ``[0, K)`` in an included row, instead of a silent NaN or a
    clipped gather. Under ``jax.jit`` or ``jax.grad`` the inputs are tracers
    and nothing is checked: the jitted training step pays no host sync.

    Raises:
      ValueError: naming the first offending row and how many rows are bad.
    """
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


# ---------------------------------------------------------------------------
# Scalar hyperparameters (concrete values are checked; tracers pass).
# ---------------------------------------------------------------------------


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
