"""Shared jittable pieces of the metric cores (no value checks): top-label
extraction and binned errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.metrics import _cpu_kernels


def as_float(x: jax.Array) -> jax.Array:
    """Upcasts bf16/fp16 to float32 (float64 stays float64)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def screen_values(probs: jax.Array) -> jax.Array:
    """``p`` where ``p >= 0``, huge for a negative ``p`` (down to about
    ``2**-137`` in float32), NaN for NaN and ``+inf``: a bad row's sum is far
    from 1. No select, so it fuses into the row reduction it feeds."""
    big = jnp.asarray(2.0 ** (jnp.finfo(probs.dtype).maxexp - 1), probs.dtype)
    return probs + (jnp.abs(probs) - probs) * big


def top_label_plain(probs: jax.Array, labels: jax.Array, *, screen: bool = False):
    """:func:`top_label` from independent row reductions (one read of
    ``probs``): the label is the first maximal class exactly when its
    probability is the maximum and every class before it is below."""
    k = lax.broadcasted_iota(jnp.int32, probs.shape, 1)
    y = labels[:, None]
    conf = jnp.max(probs, axis=1)
    before = jnp.max(jnp.where(k < y, probs, -jnp.inf), axis=1)
    at_label = jnp.sum(jnp.where(k == y, probs, 0.0), axis=1)
    out = (conf, (at_label == conf) & (before < conf))
    if screen:
        out = (*out, jnp.sum(screen_values(probs), axis=1))
    return out


_top_label_packed = kernels.dispatch("metric_top_label", _cpu_kernels.top_label)(
    top_label_plain
)


def top_label(probs: jax.Array, labels: jax.Array, *, screen: bool = False):
    r"""Top-label confidence and correctness in one pass over ``probs``.

    .. math::

        c_i = \max_k p_{ik}, \qquad a_i = [\,\hat y_i = y_i\,],\quad
        \hat y_i = \min\{k : p_{ik} = c_i\},

    i.e. ``np.argmax``'s tie rule. ``probs`` float ``[N, K]`` in [0, 1],
    ``labels`` int ``[N]``; returns ``(conf, correct)``, float and bool
    ``[N]``, with ``screen`` also the row sums of :func:`screen_values`.
    """
    probs = as_float(probs)
    labels = labels.astype(jnp.int32)
    form = _top_label_packed if probs.dtype == jnp.float32 else top_label_plain
    return form(probs, labels, screen=screen)


@kernels.dispatch("sort_keys", _cpu_kernels.sorted_by_confidence)
def sorted_by_confidence(
    conf: jax.Array, flag: jax.Array, valid: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(conf, flag)`` ``[N]`` sorted by confidence, then flag: float32
    (``-0.0`` read as ``0.0``) and int32; the excluded rows come last with
    unspecified confidences above 1."""
    c = jnp.where(valid, conf.astype(jnp.float32) + 0.0, jnp.inf)
    f = jnp.where(valid, flag.astype(jnp.int32), 1)
    return lax.sort((c, f), num_keys=2)


def label_prob(probs: jax.Array, labels: jax.Array) -> jax.Array:
    """``probs[i, labels[i]]`` as float ``[N]``."""
    labels = labels.astype(jnp.int32)
    return jnp.take_along_axis(as_float(probs), labels[:, None], axis=1)[:, 0]


def mask_or_ones(where: jax.Array | None, n: int) -> jax.Array:
    """The bool ``[N]`` mask of included rows (all True for None)."""
    if where is None:
        return jnp.ones((n,), bool)
    return jnp.asarray(where, bool)


def binned_error(
    count: jax.Array,
    sum_conf: jax.Array,
    sum_correct: jax.Array,
    total: jax.Array,
    *,
    p: float,
    min_count: int = 1,
) -> jax.Array:
    """ECE (``p=1``), RMSCE (``p=2``) or MCE (``p=inf``) from ``[..., S]``
    per-bin sums and ``total`` samples, reduced over the last axis to float32
    ``[...]``; bins with fewer than ``min_count`` samples contribute nothing."""
    count = count.astype(jnp.float32)
    gap = sum_conf.astype(jnp.float32) - sum_correct.astype(jnp.float32)
    keep = count >= max(int(min_count), 1)
    safe_count = jnp.where(keep, count, 1.0)
    denom = jnp.maximum(jnp.asarray(total, jnp.float32), 1.0)
    if p == 1:
        return jnp.sum(jnp.where(keep, jnp.abs(gap), 0.0), axis=-1) / denom
    if p == 2:
        return jnp.sqrt(squared_error(count, gap, keep, denom))
    if p == float("inf"):
        return jnp.max(jnp.where(keep, jnp.abs(gap) / safe_count, 0.0), axis=-1)
    raise ValueError(f"p must be 1, 2 or inf, got {p!r}.")


def squared_error(count, gap, keep, denom) -> jax.Array:
    """``sum_b (n_b / N) (acc_b - conf_b)^2`` over the last axis (no root)."""
    safe_count = jnp.where(keep, count, 1.0)
    return jnp.sum(jnp.where(keep, gap * gap / safe_count, 0.0), axis=-1) / denom
