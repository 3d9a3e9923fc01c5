"""The losses' base: masking, gathers, row statistics, true class versus rest.

Masking uses ``jnp.where`` (never a product): NaN/inf in a padded row reach
neither the value nor the gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _cpu_kernels


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values[mask]``; 0 when no row is included."""
    total = jnp.sum(jnp.where(mask, values, 0.0))
    count = jnp.sum(mask.astype(values.dtype))
    return total / jnp.maximum(count, 1.0)


def masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of ``values[mask]``; excluded rows may hold NaN/inf."""
    return jnp.sum(jnp.where(mask, values, 0.0))


def zero_masked(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-example output with excluded rows set to exactly 0."""
    return jnp.where(mask, values, jnp.zeros_like(values))


def zero_excluded_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Zeroes the logits of excluded rows (their NaN/inf reach nothing)."""
    return jnp.where(mask[:, None], logits, jnp.zeros_like(logits))


def zero_excluded_rows(logits: jax.Array, labels: jax.Array, mask: jax.Array):
    """Zeroes the logits and labels of excluded rows (their cotangent is 0)."""
    logits = jnp.where(mask[:, None], logits, jnp.zeros_like(logits))
    labels = jnp.where(mask, labels, jnp.zeros_like(labels))
    return logits, labels


def take_col(x: jax.Array, idx: jax.Array) -> jax.Array:
    """``x[b, idx[b]]`` as ``[B]``; the gradient goes to that one entry."""
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def first_index(x: jax.Array, value: jax.Array) -> jax.Array:
    """First column ``k`` with ``x[b, k] == value[b]`` (a row max or min, so
    attained), int32 ``[B]``, no gradient: ``jnp.argmax``'s tie rule."""
    cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    first = jnp.min(jnp.where(x == value[:, None], cols, x.shape[1]), axis=1)
    return lax.stop_gradient(first)


def first_max(x: jax.Array) -> jax.Array:
    """The row maximum; its derivative goes to the first maximal entry."""
    return take_col(x, jnp.argmax(x, axis=1).astype(jnp.int32))


def clamp(x: jax.Array, lo, hi) -> jax.Array:
    """``torch.clamp``: derivative 1 on the closed ``[lo, hi]``, 0 outside
    (``jnp.clip`` would halve it at the bounds)."""
    lo = jnp.asarray(lo, x.dtype)
    hi = jnp.asarray(hi, x.dtype)
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))


def safe_pow(x: jax.Array, exponent) -> jax.Array:
    """``x ** exponent`` for ``x >= 0`` with value and gradient 0 at ``x == 0``."""
    pos = x > 0
    safe = jnp.where(pos, x, jnp.ones_like(x))
    return jnp.where(pos, safe**exponent, jnp.zeros_like(x))


class Split(NamedTuple):
    """Per-row true-class-versus-rest statistics, each ``[B]``."""

    z_true: jax.Array  # z_y
    z_rest_max: jax.Array  # max_{k != y} z_k, a constant (no gradient)
    rest_sum: jax.Array  # sum_{k != y} exp(z_k - z_rest_max), >= 1
    rest_sq_sum: jax.Array | None  # sum_{k != y} exp(z_k - z_rest_max)^2, >= 1

    @property
    def d(self) -> jax.Array:
        """Log-odds of the true class against all the others."""
        # The shift is a constant: log-sum-exp is shift invariant.
        lse_rest = lax.stop_gradient(self.z_rest_max) + jnp.log(self.rest_sum)
        return self.z_true - lse_rest

    @property
    def log_p_true(self) -> jax.Array:
        return jax.nn.log_sigmoid(self.d)

    @property
    def log_1m_p_true(self) -> jax.Array:
        return jax.nn.log_sigmoid(-self.d)

    @property
    def log_sq_ratio(self) -> jax.Array:
        """``log(sum_{k != y} e_k^2 / (sum_{k != y} e_k)^2)``."""
        return jnp.log(self.rest_sq_sum) - 2.0 * jnp.log(self.rest_sum)


def true_vs_rest(
    logits: jax.Array, labels: jax.Array, *, squares: bool = False
) -> Split:
    """The log-odds ``d = z_y - log sum_{k != y} e^{z_k}`` and its parts: ``log
    p_y = log_sigmoid(d)`` and ``log(1 - p_y) = log_sigmoid(-d)`` stay finite,
    with finite gradients, where ``p_y`` rounds to 0 or 1 (K >= 2)."""
    return Split(*rest_parts(logits, labels, squares=squares))


@kernels.dispatch("loss_true_vs_rest", _cpu_kernels.rest_parts)
def rest_parts(z, labels, *, squares):
    """``(z_y, r, sum_{k != y} e^{z_k - r}, the squares' sum or None)``: a
    log-sum-exp with the label masked out."""
    z_true = take_col(z, labels)
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    rest_max = lax.stop_gradient(jnp.max(rest, axis=1))
    s = rest - rest_max[:, None]
    rest_sq = jnp.sum(jnp.exp(2.0 * s), axis=1) if squares else None
    return z_true, rest_max, jnp.sum(jnp.exp(s), axis=1), rest_sq


class Rows(NamedTuple):
    """Per-example softmax statistics, each ``[B]`` (None when not requested)."""

    correct: jax.Array | None  # 1[first arg-max == y], float, no gradient
    ce: jax.Array | None  # -log p_y
    conf: jax.Array | None  # max_k p_k
    entropy: jax.Array | None  # -sum_k p_k log p_k
    margin: jax.Array | None  # p_(1) - p_(2)


def row_stats(
    logits: jax.Array,
    labels: jax.Array | None = None,
    *,
    ce: bool = False,
    conf: bool = False,
    entropy: bool = False,
    margin: bool = False,
) -> Rows:
    """The per-example softmax statistics the static flags request (see
    ``Rows``); tied maxima share the confidence's derivative, as for
    ``jnp.max``, and the margin is 0 on a tie at the top."""
    flags = {"has_labels": labels is not None, "ce": ce, "conf": conf}
    flags.update(entropy=entropy, margin=margin)
    # Labels are an argument (not a closure) so that no tracer is captured.
    ids = labels if labels is not None else jnp.zeros(logits.shape[:1], jnp.int32)
    outs = row_parts(logits, ids, **flags)
    if "correct" in outs:
        outs["correct"] = lax.stop_gradient(outs["correct"])
    return Rows(**{name: outs.get(name) for name in Rows._fields})


@kernels.dispatch("loss_rows", _cpu_kernels.row_parts)
def row_parts(x, labels, *, has_labels, ce, conf, entropy, margin):
    """:func:`row_stats` as a dict: ``log_softmax`` and JAX's derivatives."""
    logp = jax.nn.log_softmax(x, axis=-1)
    p = jnp.exp(logp)
    outs = {}
    if has_labels or margin:
        first = first_index(x, jnp.max(x, axis=-1))
    if has_labels:
        outs["correct"] = (first == labels).astype(x.dtype)
        if ce:
            outs["ce"] = -take_col(logp, labels)
    if conf or margin:
        top = jnp.max(p, axis=-1)
    if conf:
        outs["conf"] = top
    if entropy:
        outs["entropy"] = -jnp.sum(p * logp, axis=-1)
    if margin:
        # The runner-up: the largest p once the first maximum is left out.
        cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
        rest = jnp.where(cols == first[:, None], 0.0, p)
        outs["margin"] = top - jnp.max(rest, axis=-1)
    return outs
