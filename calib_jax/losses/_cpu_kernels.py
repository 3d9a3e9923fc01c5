"""XLA:CPU drop-ins for the plain loss kernels, chosen by ``@kernels.dispatch``:
fused variadic row reductions and ``custom_jvp`` rules whose transpose is one
elementwise pass. Nothing here imports a loss module."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _take_col(x: jax.Array, idx: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def row_reduce(operands, inits, combiners):
    """Reduces each ``[B, K]`` operand over the classes in one variadic reduction
    (``[B]`` each, no gradient; vectorised with at most one float sum)."""
    operands = tuple(lax.stop_gradient(op) for op in operands)
    inits = tuple(jnp.asarray(v, op.dtype) for v, op in zip(inits, operands))

    def combine(a, b):
        return tuple(f(u, v) for f, u, v in zip(combiners, a, b))

    return lax.reduce(operands, inits, combine, (1,))


def no_tangent(x: jax.Array) -> np.ndarray:
    """The (float0) tangent of an integer output of a ``custom_jvp`` rule."""
    return np.zeros(x.shape, jax.dtypes.float0)


def unfused(x: jax.Array) -> jax.Array:
    """Identity that keeps XLA:CPU from fusing a row reduction into its broadcast."""
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def clamped_exp(s: jax.Array) -> jax.Array:
    """``exp(min(s, 0))`` whose derivative at ``s == 0`` is that of ``exp``."""
    return jnp.exp(jnp.where(s > 0, jnp.zeros_like(s), s))


def max_rest_logit(z: jax.Array, z_true: jax.Array) -> jax.Array:
    """``max_{k != y} z_k`` per row without a compare with the label: the row
    max, or the largest logit below it when the label is the unique maximum."""
    finfo = jnp.finfo(z.dtype)
    m = unfused(jnp.max(z, axis=1))
    below = z < m[:, None]
    second, n_top = row_reduce(
        (jnp.where(below, z, finfo.min), jnp.where(below, 0, 1).astype(jnp.int32)),
        (finfo.min, 0),
        (lax.max, lax.add),
    )
    return jnp.where((z_true >= m) & (n_top == 1), second, m)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _rest_parts(z, labels, squares):
    """Custom JVP of :func:`rest_parts`: ``c = exp(min(z - r, 0))`` written
    once and reused by the gradient; ``sum_k c_k - c_y >= 1`` cancels nothing."""
    z_true = _take_col(z, labels)
    rest_max = max_rest_logit(z, z_true)
    # The rule's expressions: XLA computes c once and reuses it for the gradient.
    c = clamped_exp(z - rest_max[:, None])
    c_true = clamped_exp(z_true - rest_max)
    rest_sq = None
    if squares:
        # The barrier keeps XLA:CPU from recomputing c * c as exp(2 s).
        c = lax.optimization_barrier(c)
        sq, n_ge = row_reduce(
            (c * c, jnp.where(c < 1.0, 0, 1).astype(jnp.int32)),
            (0, 0),
            (lax.add, lax.add),
        )
        # n_ge >= 1 (c = 1 at the largest other logit): no value changes; using
        # n_ge keeps the reduction two-output.
        sq = jnp.where(n_ge > 0, sq, jnp.full_like(sq, jnp.nan))
        rest_sq = sq - c_true * c_true
    rest = jnp.sum(c, axis=1) - c_true
    return z_true, rest_max, rest, rest_sq


@_rest_parts.defjvp
def _rest_parts_jvp(squares, primals, tangents):
    z, labels = primals
    dz, _ = tangents
    out = _rest_parts(z, labels, squares)
    z_true, rest_max = out[0], lax.stop_gradient(out[1])
    c = clamped_exp(z - rest_max[:, None])
    c_true = clamped_exp(z_true - rest_max)
    dz_true = _take_col(dz, labels)
    drest = jnp.sum(c * dz, axis=1) - c_true * dz_true
    drest_sq = None
    if squares:
        c = lax.optimization_barrier(c)  # as in the primal: c * c, not exp(2 s)
        drest_sq = 2.0 * (jnp.sum(c * c * dz, axis=1) - c_true * c_true * dz_true)
    return out, (dz_true, jnp.zeros_like(rest_max), drest, drest_sq)


def rest_parts(z, labels, *, squares):
    """Drop-in for ``_base.rest_parts`` (family ``'loss_true_vs_rest'``)."""
    return _rest_parts(z, labels, squares)


def row_parts(x, labels, *, has_labels, ce, conf, entropy, margin):
    """Drop-in for ``_base.row_parts``: one exponential pass and a custom JVP
    whose transpose is one elementwise ``[B, K]`` pass."""
    want_top = conf or margin

    def forward(x, labels):
        # unfused: XLA:CPU would otherwise write ``s`` out as a [B, K] array.
        m = unfused(jnp.max(x, axis=-1))
        s = x - m[:, None]
        e = jnp.exp(s)
        # With labels, the first exact maximum (s == 0) rides in the reduction.
        count = (
            functools.partial(sum_top_count_first, s=s)
            if has_labels
            else sum_and_top_count
        )
        if entropy:
            # The tie count rides with sum_k e_k s_k (else s is written out).
            z = jnp.sum(e, axis=-1)
            ses, n_top, *first = count(e * s, e)
        else:
            z, n_top, *first = count(e, e)
        log_z = jnp.log(z)
        aux = {"s": s, "e": e, "z": z, "log_z": log_z, "n_top": n_top}
        outs = {}
        if has_labels:
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
            # n_top >= 1 wherever h is not NaN: no value changes; using n_top
            # keeps the reduction two-output (XLA:CPU drops unused outputs).
            h = jnp.where(n_top > 0, h, jnp.full_like(h, jnp.nan))
            aux["h"] = outs["entropy"] = h
        if margin:
            # A tie at the top gives margin 0; e2 = exp(s_(2)), the largest
            # entry of e below 1, read off without a select (XLA:CPU fuses it).
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
        # Every output tangent is a row sum sum_k W[b, k] t[b, k] over fixed
        # bases W (p, the label one-hot, the top indicator, p * s), so the
        # gradient is one elementwise pass over those bases.
        (x, labels), (t, _) = primals, tangents
        outs, aux = forward(x, labels)
        s, e, z, log_z = aux["s"], aux["e"], aux["z"], aux["log_z"]
        p = e / z[:, None]
        p_t = jnp.sum(p * t, axis=-1)
        touts = {}
        if has_labels:
            touts["correct"] = jnp.zeros_like(outs["correct"])
        if ce:
            # A gather: its transpose is an in-place scatter, not a [B, K] compare.
            t_y = jnp.take_along_axis(t, labels[:, None], axis=-1)[:, 0]
            touts["ce"] = p_t - t_y
        if want_top:
            n_top = aux["n_top"].astype(x.dtype)
            # e >= 1 is the top indicator (e <= 1).
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
            # Runner-up indicator: e2 is an entry of e, so == is exact.
            second = (e == e2[:, None]).astype(s.dtype)
            n_second = jnp.maximum(jnp.sum(second, axis=-1), 1.0)
            t2 = jnp.sum(second * t, axis=-1) / n_second
            d_margin = dc - aux["c"] * e2 * (t2 - p_t)
            touts["margin"] = jnp.where(n_top > 1, jnp.zeros_like(d_margin), d_margin)
        return outs, touts

    return stats(x, labels)


@jax.custom_jvp
def sum_and_top_count(v: jax.Array, e: jax.Array):
    """``(sum_k v_k, #{k: e_k == 1})`` per row (``e = exp(s)``, ``s <= 0``); the
    sum stays differentiable."""
    return row_reduce((v, (e >= 1.0).astype(jnp.int32)), (0, 0), (lax.add, lax.add))


@sum_and_top_count.defjvp
def _sum_and_top_count_jvp(primals, tangents):
    (v, e), (dv, _) = primals, tangents
    out = sum_and_top_count(v, e)
    return out, (jnp.sum(dv, axis=-1), no_tangent(out[1]))


@jax.custom_jvp
def sum_top_count_first(v: jax.Array, e: jax.Array, s: jax.Array):
    """:func:`sum_and_top_count` plus the first index with ``s == 0`` (int32;
    ``K`` for a row without one)."""
    k = s.shape[-1]
    cols = lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 1)
    return row_reduce(
        (v, (e >= 1.0).astype(jnp.int32), jnp.where(s == 0, cols, k)),
        (0, 0, k),
        (lax.add, lax.add, lax.min),
    )


@sum_top_count_first.defjvp
def _sum_top_count_first_jvp(primals, tangents):
    (v, e, s), (dv, _, _) = primals, tangents
    out = sum_top_count_first(v, e, s)
    return out, (
        jnp.sum(dv, axis=-1),
        no_tangent(out[1]),
        no_tangent(out[2]),
    )


@jax.custom_jvp
def dual_parts(z, labels):
    """Drop-in for ``_focal.dual_parts``: one fused reduction for the sum and
    the arg-max, and a custom JVP."""
    k = z.shape[1]
    z_true = _take_col(z, labels)
    z_rest_max = max_rest_logit(z, z_true)
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    c = clamped_exp(z - z_rest_max[:, None])  # the same expression as the rule's
    total, first = row_reduce(
        (
            c,
            jnp.where((z == z_rest_max[:, None]) & (cols != labels[:, None]), cols, k),
        ),
        (0, k),
        (lax.add, lax.min),
    )
    rest_sum = total - clamped_exp(z_true - z_rest_max)
    return z_true, z_rest_max, rest_sum, first


@dual_parts.defjvp
def _dual_parts_jvp(primals, tangents):
    z, labels = primals
    dz, _ = tangents
    out = dual_parts(z, labels)
    z_true, z_rest_max, _, first = out
    shift = lax.stop_gradient(z_rest_max)
    c = clamped_exp(z - shift[:, None])
    dtrue = _take_col(dz, labels)
    drest_sum = jnp.sum(c * dz, axis=1) - clamped_exp(z_true - shift) * dtrue
    return out, (dtrue, _take_col(dz, first), drest_sum, no_tangent(first))


@jax.custom_jvp
def _mbls_parts(z, margin):
    """``(top, hinge, count, first)``: one max pass, one fused pass, and a
    custom JVP (``top`` moves with the first arg-max)."""
    k = z.shape[1]
    top = unfused(jnp.max(z, axis=1))
    gap = top[:, None] - z - margin
    active = gap > 0
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    hinge, count, first = row_reduce(
        (
            jnp.where(active, gap, 0.0),
            active.astype(jnp.int32),
            jnp.where(z == top[:, None], cols, k),
        ),
        (0, 0, k),
        (lax.add, lax.add, lax.min),
    )
    return top, hinge, count, first


@_mbls_parts.defjvp
def _mbls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = _mbls_parts(z, margin)
    top, _, count, first = out
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    active = top[:, None] - z - margin > 0
    dtop = jnp.sum(jnp.where(cols == first[:, None], dz, 0.0), axis=1)
    # d sum_{k active} (top - z_k - m) = count (dtop - dm) - sum_{k active} dz_k.
    dhinge = count.astype(z.dtype) * (dtop - dmargin) - jnp.sum(
        jnp.where(active, dz, 0.0), axis=1
    )
    return out, (dtop, dhinge, no_tangent(count), no_tangent(first))


def mbls_hinge(z, margin):
    """Drop-in for ``_margin.mbls_hinge`` (family ``'loss_mbls'``)."""
    return _mbls_parts(z, margin)[1]


@jax.custom_jvp
def _acls_parts(z, margin):
    """``(top, low, hinge, neg, first_max, first_min, count)`` and a custom JVP
    (``top``/``low`` move with the first arg-max/arg-min)."""
    k = z.shape[1]
    top, low = row_reduce((z, z), (-jnp.inf, jnp.inf), (lax.max, lax.min))
    gap = top[:, None] - z - margin
    active = gap > 0
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    # One float sum per reduction, grouped so that under value_and_grad every
    # reduction keeps two used outputs (count only feeds hinge's derivative).
    hinge, first_max, count = row_reduce(
        (
            jnp.where(active, gap, 0.0),
            jnp.where(z == top[:, None], cols, k),
            active.astype(jnp.int32),
        ),
        (0, k, 0),
        (lax.add, lax.min, lax.add),
    )
    neg, first_min = row_reduce(
        (jnp.where(active, gap * gap, 0.0), jnp.where(z == low[:, None], cols, k)),
        (0, k),
        (lax.add, lax.min),
    )
    return top, low, hinge, neg, first_max, first_min, count


@_acls_parts.defjvp
def _acls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = _acls_parts(z, margin)
    top, _, hinge, _, first_max, first_min, count = out
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    gap = top[:, None] - z - margin
    active = lax.stop_gradient(gap) > 0
    relu_gap = jnp.where(active, gap, 0.0)
    dtop = jnp.sum(jnp.where(cols == first_max[:, None], dz, 0.0), axis=1)
    dlow = jnp.sum(jnp.where(cols == first_min[:, None], dz, 0.0), axis=1)
    dshift = dtop - dmargin  # d(top - margin)
    dhinge = count.astype(z.dtype) * dshift - jnp.sum(
        jnp.where(active, dz, 0.0), axis=1
    )
    # d sum_j ReLU(g_j)^2 = 2 hinge d(top - M) - 2 sum_j ReLU(g_j) dz_j.
    dneg = 2.0 * hinge * dshift - 2.0 * jnp.sum(relu_gap * dz, axis=1)
    int_tangents = tuple(no_tangent(v) for v in (first_max, first_min, count))
    return out, (dtop, dlow, dhinge, dneg, *int_tangents)


def acls_parts(z, margin):
    """Drop-in for ``_margin.acls_parts`` (family ``'loss_acls'``)."""
    top, low, _, neg, _, _, _ = _acls_parts(z, margin)
    return top, low, neg


def _sortable(x: jax.Array) -> jax.Array:
    """Signed integers ordered as the floats ``x`` (no NaN, no -0.0), ``[B]``."""
    itype = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
    bits = lax.bitcast_convert_type(x, itype)
    # Negative floats order by decreasing magnitude: flip all but the sign bit.
    return jnp.where(bits < 0, bits ^ jnp.iinfo(itype).max, bits)


def tie_groups(x):
    """Drop-in for ``_aurc.tie_groups`` (family ``'sort_keys'``): the floats
    sorted as integer keys."""
    key = _sortable(x)
    key_sorted = lax.sort(key)
    first = jnp.searchsorted(key_sorted, key, side="left", method="scan")
    new_group = jnp.concatenate(
        [jnp.ones((1,), bool), key_sorted[1:] != key_sorted[:-1]]
    )
    return first, new_group
