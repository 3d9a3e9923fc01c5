"""Per-row softmax statistics shared by the batch-level losses.

One exponential pass over ``[B, K]`` gives, per row, what the batch-level
losses need (cross-entropy, maximum probability, entropy, top-2 margin,
correctness), with hand-written derivatives so the backward pass adds no second
``[B, K]`` softmax. Private: used by _selective, _soft_ece, _avuc, _mmce, _mdca.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


def _clean(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Zeroes excluded rows so that their NaN/inf reach neither value nor gradient."""
    return jnp.where(mask[:, None], logits, jnp.zeros_like(logits))


def _pick(x: jax.Array, idx: jax.Array) -> jax.Array:
    """``x[b, idx[b]]`` as a masked row sum, ``[B]``.

    Same value as a gather, but it (and its transpose) is elementwise work that
    fuses with the other ``[B, K]`` passes instead of a gather/scatter.
    """
    cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.sum(jnp.where(cols == idx[:, None], x, jnp.zeros_like(x)), axis=-1)


def _top_weight(e: jax.Array) -> jax.Array:
    """Weight ``1[top] / n_top`` of the maximal entries, from ``e = exp(s)``.

    The maxima are the entries with ``exp(s) == 1`` (``s`` within rounding of
    0: about 6e-8 in float32), so the tie count is a reduction over ``e``
    itself, which keeps XLA:CPU from materialising another ``[B, K]`` array.
    Tied maxima share the derivative evenly, as for ``jnp.max``.
    """
    top = jnp.floor(e)
    return top / jnp.sum(top, axis=-1, keepdims=True)


class _Rows(NamedTuple):
    """Per-example softmax statistics, each ``[B]`` (None when not requested)."""

    correct: jax.Array | None  # 1[z_y = max_k z_k], float, no gradient
    ce: jax.Array | None  # -log p_y
    conf: jax.Array | None  # max_k p_k
    entropy: jax.Array | None  # -sum_k p_k log p_k
    margin: jax.Array | None  # p_(1) - p_(2)


def _row_stats(
    logits: jax.Array,
    labels: jax.Array | None = None,
    *,
    ce: bool = False,
    conf: bool = False,
    entropy: bool = False,
    margin: bool = False,
) -> _Rows:
    r"""The requested per-example statistics from one exponential pass.

    Everything is computed from the row-shifted logits :math:`s = z - \max_k z_k`
    (``<= 0``, exactly 0 at the maxima), so nothing overflows at logits of
    magnitude 1e4 and the entropy :math:`\log\sum e^{s} - \sum_k p_k s_k` is a
    sum of two non-negative terms. Derivatives are given by a ``custom_jvp``
    with the closed forms

    .. math::

        d(-\log p_y) = \textstyle\sum_k p_k t_k - t_y, \quad
        dc = c\,(\bar t_{\text{top}} - \textstyle\sum_k p_k t_k), \quad
        dh = -\textstyle\sum_k p_k(\log p_k + h)\,t_k,

    (:math:`\bar t_{\text{top}}` the mean tangent over tied maxima, see
    :func:`_top_weight`), which JAX
    transposes into a single fused ``[B, K]`` pass for the gradient; forward
    mode and higher derivatives keep working. No ``argmax`` is used: on CPU it
    is a slow variadic reduction. Correctness is :math:`z_y = \max_k z_k`, so on
    an exact tie for the top logit a label among the tied classes counts as
    correct (ties have probability zero for continuous logits).
    """
    want_top = conf or margin
    has_labels = labels is not None

    def forward(x, labels):
        s = x - jnp.max(x, axis=-1, keepdims=True)
        e = jnp.exp(s)
        z = jnp.sum(e, axis=-1)
        log_z = jnp.log(z)
        aux = {"s": s, "e": e, "z": z, "log_z": log_z}
        outs = {}
        if has_labels:
            # A gather (no derivative is taken through it: the rule below is
            # explicit), computed here rather than outside the custom rule.
            s_y = jnp.take_along_axis(s, labels[:, None], axis=-1)[:, 0]
            outs["correct"] = (s_y == 0).astype(x.dtype)
            if ce:
                outs["ce"] = log_z - s_y
        if want_top:
            aux["c"] = c = 1.0 / z  # = exp(0 - log_z): the top entry of s is 0
            if conf:
                outs["conf"] = c
        if entropy:
            aux["h"] = outs["entropy"] = log_z - jnp.sum(e * s, axis=-1) / z
        if margin:
            # Maxima as in _top_weight (exp(s) == 1); a tie at the top means
            # p_(2) = p_(1) and a margin of 0. e2 = exp(s_(2)) is read off e (the
            # largest entry below 1) without a select, which XLA:CPU fuses.
            top = jnp.floor(e)
            n_top = jnp.sum(top, axis=-1)
            e2 = jnp.max(e - top, axis=-1)
            e2 = jnp.where(n_top > 1, jnp.ones_like(e2), e2)
            aux.update(n_top=n_top, e2=e2)
            outs["margin"] = c * (1.0 - e2)  # p1 - p2 = c (1 - e^{s2})
        return outs, aux

    @jax.custom_jvp
    def stats(x, labels):
        return forward(x, labels)[0]

    @stats.defjvp
    def stats_jvp(primals, tangents):
        # Every output tangent is a combination of a few row sums
        # sum_k W[b, k] t[b, k] over fixed bases W (p, the label one-hot, the
        # top indicator, p * s), so the transpose (the gradient) is a single
        # elementwise pass over those bases.
        (x, labels), (t, _) = primals, tangents
        outs, aux = forward(x, labels)
        s, e, z, log_z = aux["s"], aux["e"], aux["z"], aux["log_z"]
        p = e / z[:, None]
        p_t = jnp.sum(p * t, axis=-1)
        touts = {}
        if has_labels:
            touts["correct"] = jnp.zeros_like(outs["correct"])
        if ce:
            touts["ce"] = p_t - _pick(t, labels)
        if want_top:
            dc = aux["c"] * (jnp.sum(_top_weight(e) * t, axis=-1) - p_t)
            if conf:
                touts["conf"] = dc
        if entropy:
            ps_t = jnp.sum(p * s * t, axis=-1)
            touts["entropy"] = (log_z - aux["h"]) * p_t - ps_t
        if margin:
            e2, n_top = aux["e2"], aux["n_top"]
            # Runner-up indicator: e2 is one of the entries of e, so == is exact
            # (and, without a tie at the top, e2 < 1 excludes the maximum).
            second = (e == e2[:, None]).astype(s.dtype)
            n_second = jnp.maximum(jnp.sum(second, axis=-1), 1.0)
            t2 = jnp.sum(second * t, axis=-1) / n_second
            d_margin = dc - aux["c"] * e2 * (t2 - p_t)
            touts["margin"] = jnp.where(n_top > 1, jnp.zeros_like(d_margin), d_margin)
        return outs, touts

    # Labels are an argument (not a closure) so that no tracer is captured.
    ids = labels if has_labels else jnp.zeros(logits.shape[:1], jnp.int32)
    outs = stats(logits, ids)
    if "correct" in outs:
        outs["correct"] = lax.stop_gradient(outs["correct"])
    return _Rows(**{name: outs.get(name) for name in _Rows._fields})


def _safe_pow(x: jax.Array, exponent) -> jax.Array:
    """``x ** exponent`` for ``x >= 0`` with value 0 and gradient 0 at ``x == 0``.

    Used for the p-th powers and p-th roots of the ECE family and the square root
    of MMCE, whose derivative is unbounded at 0 (the subgradient 0 is taken).
    """
    pos = x > 0
    safe = jnp.where(pos, x, jnp.ones_like(x))
    return jnp.where(pos, safe**exponent, jnp.zeros_like(x))


def _check_logits(logits) -> jax.Array:
    """Logits-only counterpart of ``prepare``: float ``[B, K]`` upcast to >= f32."""
    logits = jnp.asarray(logits)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"logits must be floating point, got dtype {logits.dtype}.")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape [B, K], got shape {logits.shape}.")
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
