r"""Shared pieces of the metric cores: top-label extraction and binned errors.

Everything here is jittable and does no value checks.
"""

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
    """``p`` where ``p >= 0``; a negative ``p`` becomes ``p + 2|p| * 2**(e-1)``
    (``2**(e-1)`` the largest power of two of the dtype), NaN stays NaN and
    ``+inf`` becomes NaN.

    A row of probabilities keeps its sum; a row with a NaN/inf or a negative
    entry (down to about ``2**-137`` in float32) gets a sum far from 1. Plain
    arithmetic, no select, so it fuses into the row reduction it feeds.
    """
    big = jnp.asarray(2.0 ** (jnp.finfo(probs.dtype).maxexp - 1), probs.dtype)
    return probs + (jnp.abs(probs) - probs) * big


def top_label_plain(probs: jax.Array, labels: jax.Array, *, screen: bool = False):
    """:func:`top_label` from row reductions that do not depend on each other
    (one read of ``probs`` on an accelerator, where ``jnp.argmax`` is a
    second): the label is the first maximal class exactly when its
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

    i.e. the prediction is ``argmax`` with ties going to the first class, as
    in NumPy, PyTorch and TensorFlow.

    Args:
      probs: float ``[N, K]`` with entries in [0, 1].
      labels: int ``[N]``.
      screen: also return the row sums of :func:`screen_values` (the value
        screen of the metrics' input check), from the same reduction.

    Returns:
      ``(conf, correct)``: float ``[N]`` and bool ``[N]``; with ``screen``
      ``(conf, correct, sums)``.

    Plain formulation :func:`top_label_plain`; float32 probabilities are
    kernel family ``'metric_top_label'`` (``_cpu_kernels.top_label``).
    Float64 reference ``tests/_reference_metrics.py``.
    """
    probs = as_float(probs)
    labels = labels.astype(jnp.int32)
    form = _top_label_packed if probs.dtype == jnp.float32 else top_label_plain
    return form(probs, labels, screen=screen)


@kernels.dispatch("sort_keys", _cpu_kernels.sorted_by_confidence)
def sorted_by_confidence(
    conf: jax.Array, flag: jax.Array, valid: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(conf, flag)`` sorted by confidence, then flag; excluded rows last.

    Args:
      conf: float ``[N]`` confidences in [0, 1].
      flag: bool ``[N]``.
      valid: bool ``[N]`` included rows.

    Returns:
      float32 ``[N]`` sorted confidences (``-0.0`` read as ``0.0``; the values
      of the excluded rows at the end are unspecified, above 1) and int32
      ``[N]`` flags.

    Plain: one ``lax.sort`` of (confidence, flag); kernel family
    ``'sort_keys'`` (``_cpu_kernels.sorted_by_confidence``). Float64
    reference ``equal_mass_members`` in ``tests/_reference_metrics.py``.
    """
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
    r"""Calibration error from per-bin sums, reduced over the last axis.

    .. math::

        \mathrm{CE}_1 = \sum_b \frac{|S^c_b - S^a_b|}{N},\quad
        \mathrm{CE}_2 = \Big(\sum_b \frac{(S^c_b - S^a_b)^2}{n_b N}\Big)^{1/2},
        \quad
        \mathrm{CE}_\infty = \max_b \frac{|S^c_b - S^a_b|}{n_b},

    with :math:`S^c_b, S^a_b` the sums of confidences and of correct
    indicators in bin :math:`b`, i.e. :math:`\frac{n_b}{N}|\mathrm{acc}_b -
    \mathrm{conf}_b|` summed. Bins with fewer than ``min_count`` samples
    contribute nothing (empty bins never give NaN).

    Args:
      count, sum_conf, sum_correct: ``[..., S]`` per-bin statistics.
      total: number of samples ``N`` (scalar or broadcastable to ``[...]``).
      p: 1, 2 or ``inf``.
      min_count: static int, bins below it are skipped.

    Returns:
      float32 ``[...]`` (for ``p = 2`` after the square root).
    """
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
