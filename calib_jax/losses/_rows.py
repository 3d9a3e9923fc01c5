"""Per-row softmax statistics shared by the batch-level losses.

One exponential pass over ``[B, K]`` gives, per row, what the batch-level
losses need (cross-entropy, maximum probability, entropy, top-2 margin,
correctness), with hand-written derivatives so the backward pass adds no second
``[B, K]`` softmax. Private: used by _selective, _soft_ece, _avuc, _mmce, _mdca.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses._margin import _no_tangent, _row_reduce, _unfused


def _clean(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Zeroes excluded rows so that their NaN/inf reach neither value nor gradient."""
    return jnp.where(mask[:, None], logits, jnp.zeros_like(logits))


class _Rows(NamedTuple):
    """Per-example softmax statistics, each ``[B]`` (None when not requested)."""

    correct: jax.Array | None  # 1[first arg-max == y], float, no gradient
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

    (:math:`\bar t_{\text{top}}` the mean tangent over tied maxima), which
    JAX transposes into a single fused ``[B, K]`` pass for the gradient (the
    row sums it needs, such as the tie count, come from the forward pass; the
    label entry is a gather, whose transpose is an in-place scatter); forward
    mode and higher derivatives keep working.

    Kernel family ``'loss_rows'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`_row_stats_plain`; float64 references in
    ``tests/_reference_batch.py``.

    The maxima are the entries with ``exp(s) == 1`` (``s`` within rounding of
    0: about 6e-8 in float32); tied maxima share the derivative evenly, as for
    ``jnp.max``. The forward pass is one max reduction, one exponential pass
    (``e`` written once, as for cross-entropy) and one reduction over ``e``
    (plus one for the entropy). No ``argmax`` is used: on CPU it
    is a slow variadic reduction. Correctness is the library's rule: the first
    index of the maximal logit equals the label (what ``jnp.argmax``, NumPy and
    torch return), found by a min-reduction over the indices of the exact
    maxima; on all-equal logits only label 0 is correct.
    """
    has_labels = labels is not None
    flags = {"has_labels": has_labels, "ce": ce, "conf": conf}
    flags.update(entropy=entropy, margin=margin)
    # Labels are an argument (not a closure) so that no tracer is captured.
    ids = labels if has_labels else jnp.zeros(logits.shape[:1], jnp.int32)
    outs = kernels.select(
        "loss_rows",
        functools.partial(_row_stats_fused, **flags),
        functools.partial(_row_stats_plain, **flags),
        logits,
        ids,
    )
    if "correct" in outs:
        outs["correct"] = lax.stop_gradient(outs["correct"])
    return _Rows(**{name: outs.get(name) for name in _Rows._fields})


def _row_stats_plain(x, labels, *, has_labels, ce, conf, entropy, margin):
    """Plain formulation of :func:`_row_stats` (kernel family ``'loss_rows'``).

    ``jax.nn.log_softmax``, ``jnp.max`` and ``lax.top_k`` with JAX's own
    derivatives (``jnp.max`` also splits the derivative evenly over tied
    maxima). Float64 references: ``tests/_reference_batch.py``.
    """
    logp = jax.nn.log_softmax(x, axis=-1)
    p = jnp.exp(logp)
    outs = {}
    if has_labels:
        first = jnp.argmax(x, axis=-1).astype(labels.dtype)
        outs["correct"] = (first == labels).astype(x.dtype)
        if ce:
            outs["ce"] = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    if conf:
        outs["conf"] = jnp.max(p, axis=-1)
    if entropy:
        outs["entropy"] = -jnp.sum(p * logp, axis=-1)
    if margin:
        top2 = lax.top_k(p, 2)[0]
        outs["margin"] = top2[:, 0] - top2[:, 1]
    return outs


def _row_stats_fused(x, labels, *, has_labels, ce, conf, entropy, margin):
    """The one-pass ``custom_jvp`` kernel of :func:`_row_stats`."""
    want_top = conf or margin

    def forward(x, labels):
        # The row max is its own reduction; _unfused keeps XLA:CPU from fusing
        # the broadcast ``x - max`` into it and writing ``s`` out as a [B, K]
        # array next to ``e`` (measured at (4096, 1000): the exponential then
        # runs as a separate, slower single-op loop).
        m = _unfused(jnp.max(x, axis=-1))
        s = x - m[:, None]
        e = jnp.exp(s)
        # With labels, the first index of an exact maximum (s == 0, what
        # jnp.argmax returns) rides in the same variadic reduction.
        count = (
            functools.partial(_sum_top_count_first, s=s)
            if has_labels
            else _sum_and_top_count
        )
        if entropy:
            # The tie count goes with sum_k e_k s_k (a loop that reads x and e;
            # XLA:CPU would otherwise write s out as a [B, K] array), z is a
            # plain sum.
            z = jnp.sum(e, axis=-1)
            ses, n_top, *first = count(e * s, e)
        else:
            z, n_top, *first = count(e, e)
        log_z = jnp.log(z)
        aux = {"s": s, "e": e, "z": z, "log_z": log_z, "n_top": n_top}
        outs = {}
        if has_labels:
            # A gather (no derivative is taken through it: the rule below is
            # explicit), computed here rather than outside the custom rule.
            s_y = jnp.take_along_axis(x, labels[:, None], axis=-1)[:, 0] - m
            outs["correct"] = (first[0] == labels).astype(x.dtype)
            if ce:
                outs["ce"] = log_z - s_y
        if want_top:
            aux["c"] = c = 1.0 / z  # = exp(0 - log_z): the top entry of s is 0
            if conf:
                outs["conf"] = c
        if entropy:
            h = log_z - ses / z
            # n_top >= 1 in every row with a finite max (exp(0) == 1), and h is
            # NaN in every other row, so this select changes no value; it uses
            # n_top, which keeps the reduction that makes it a two-output loop
            # when nothing else needs the count (XLA:CPU drops unused outputs).
            h = jnp.where(n_top > 0, h, jnp.full_like(h, jnp.nan))
            aux["h"] = outs["entropy"] = h
        if margin:
            # Maxima as above (exp(s) == 1); a tie at the top means
            # p_(2) = p_(1) and a margin of 0. e2 = exp(s_(2)) is read off e (the
            # largest entry below 1) without a select, which XLA:CPU fuses.
            e2 = jnp.max(e - jnp.floor(e), axis=-1)
            e2 = jnp.where(n_top > 1, jnp.ones_like(e2), e2)
            aux["e2"] = e2
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
        # elementwise pass over those bases. Row statistics (z, the tie count)
        # come from the forward pass, so only the margin's runner-up count is
        # a reduction in the gradient program.
        (x, labels), (t, _) = primals, tangents
        outs, aux = forward(x, labels)
        s, e, z, log_z = aux["s"], aux["e"], aux["z"], aux["log_z"]
        p = e / z[:, None]
        p_t = jnp.sum(p * t, axis=-1)
        touts = {}
        if has_labels:
            touts["correct"] = jnp.zeros_like(outs["correct"])
        if ce:
            # A gather: its transpose is an in-place scatter into the gradient,
            # much cheaper on XLA:CPU than a [B, K] compare with the labels.
            t_y = jnp.take_along_axis(t, labels[:, None], axis=-1)[:, 0]
            touts["ce"] = p_t - t_y
        if want_top:
            n_top = aux["n_top"].astype(x.dtype)
            # e >= 1 is the top indicator (e <= 1); a select vectorises better
            # on XLA:CPU than the product floor(e) * t.
            top = jnp.where(e >= 1.0, t, jnp.zeros_like(t))
            top_t = jnp.sum(top, axis=-1) / n_top
            dc = aux["c"] * (top_t - p_t)
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

    return stats(x, labels)


@jax.custom_jvp
def _sum_and_top_count(v: jax.Array, e: jax.Array):
    """``(sum_k v_k, #{k: e_k == 1})`` per row from one variadic reduction.

    ``e = exp(s)`` with ``s <= 0``, so ``e >= 1`` marks the maxima (see
    :func:`_row_stats`); the count is int32. XLA:CPU emits the pair as one
    vectorised loop over the classes that also computes ``v`` and ``e`` (see
    ``_margin._row_reduce``). The rule keeps the sum differentiable (higher
    derivatives of :func:`_row_stats` go through it).
    """
    return _row_reduce((v, (e >= 1.0).astype(jnp.int32)), (0, 0), (lax.add, lax.add))


@_sum_and_top_count.defjvp
def _sum_and_top_count_jvp(primals, tangents):
    (v, e), (dv, _) = primals, tangents
    out = _sum_and_top_count(v, e)
    return out, (jnp.sum(dv, axis=-1), _no_tangent(out[1]))


@jax.custom_jvp
def _sum_top_count_first(v: jax.Array, e: jax.Array, s: jax.Array):
    """:func:`_sum_and_top_count` plus the first index with ``s == 0`` (the
    first exact maximum, int32; ``K`` for a row without one), from the same
    variadic reduction."""
    k = s.shape[-1]
    cols = lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 1)
    return _row_reduce(
        (v, (e >= 1.0).astype(jnp.int32), jnp.where(s == 0, cols, k)),
        (0, 0, k),
        (lax.add, lax.add, lax.min),
    )


@_sum_top_count_first.defjvp
def _sum_top_count_first_jvp(primals, tangents):
    (v, e, s), (dv, _, _) = primals, tangents
    out = _sum_top_count_first(v, e, s)
    return out, (
        jnp.sum(dv, axis=-1),
        _no_tangent(out[1]),
        _no_tangent(out[2]),
    )


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
