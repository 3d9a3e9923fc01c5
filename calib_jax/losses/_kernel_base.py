r"""Kernel base of the losses: fused row reductions, custom JVPs, masking.

Every loss module builds on the helpers here; none of them takes a kernel from
a sibling loss module. What the kernels are tuned for: XLA:CPU (jax 0.10). A
``[B, K]`` row kernel there is fastest when it reads its input once in one
vectorised loop over the classes (a variadic :func:`row_reduce`), writes its
exponentials out once and reuses them for the gradient, and avoids ``argmax``
and compares of the class index with the label (slow variadic reductions and
``[B, K]`` compares on that backend). So each kernel family states its
derivative in a ``custom_jvp`` rule whose transpose is one elementwise pass,
and comes with a plain formulation (``jnp`` with JAX's own autodiff) that
:func:`calib_jax.kernels.select` runs where the tuned one is not the faster
(``calib_jax.kernels.OFF_CPU``/``GPU``). The figures behind these choices are
in ``benchmarks/RESULTS.md``. Every kernel names its plain float64 reference in
``tests/`` (``tests/_reference.py``, ``tests/_reference_batch.py``);
``tests/losses/test_kernel_forms.py`` checks both formulations of every family
against them.

The masking helpers zero excluded rows with ``jnp.where`` (never a product), so
that NaN/inf in a padded row reach neither the value nor the gradient.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import kernels

# ---------------------------------------------------------------------------
# Fused row reductions.
# ---------------------------------------------------------------------------


def row_reduce(operands, inits, combiners):
    """Reduces each ``[B, K]`` operand over the classes in one variadic reduction.

    Returns one ``[B]`` array per operand. The operands are constants for
    autodiff: the callers are ``custom_jvp`` rules that state the derivatives.

    Why a variadic reduction: XLA:CPU emits it as a single loop over the
    classes that fuses the elementwise producers of all operands (compares and
    selects included), so ``[B, K]`` is read once and nothing is materialised.
    Measured at (4096, 1000), jax 0.10: the loop stays vectorised with at most
    one floating-point sum among the outputs next to integer sums or minima, or
    with floating-point maxima and minima only; two float sums, a float sum next
    to a float max, or an infinite constant in an operand's select fall back to
    a scalar loop (about 10x slower). Every output must be used: XLA drops the
    unused ones, and a reduction left with a single output is planned as a
    materialised ``[B, K]`` select plus a separate reduction.
    """
    operands = tuple(lax.stop_gradient(op) for op in operands)
    inits = tuple(jnp.asarray(v, op.dtype) for v, op in zip(inits, operands))

    def combine(a, b):
        return tuple(f(u, v) for f, u, v in zip(combiners, a, b))

    return lax.reduce(operands, inits, combine, (1,))


def no_tangent(x: jax.Array) -> np.ndarray:
    """The (float0) tangent of an integer output of a ``custom_jvp`` rule."""
    return np.zeros(x.shape, jax.dtypes.float0)


def unfused(x: jax.Array) -> jax.Array:
    """Identity (NaN stays NaN) on a reduction result ``[B]``.

    The select stops XLA:CPU from growing the (library) reduction that makes
    ``x`` into its ``[B] -> [B, K]`` broadcast, which it would then write out
    as a full ``[B, K]`` array.
    """
    return jnp.where(jnp.isnan(x), jnp.nan, x)


# ---------------------------------------------------------------------------
# Masking.
# ---------------------------------------------------------------------------


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values[mask]``; 0 when no row is included.

    ``jnp.where`` (not a product) keeps NaN/inf of excluded rows out.
    """
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
    """Zeroes the logits of excluded rows so that their NaN/inf reach neither
    value nor gradient."""
    return jnp.where(mask[:, None], logits, jnp.zeros_like(logits))


def zero_excluded_rows(logits: jax.Array, labels: jax.Array, mask: jax.Array):
    """Zeroes the logits and the labels of excluded rows so NaN/inf cannot leak.

    ``jnp.where`` (not a product): the cotangent of an excluded row is then
    exactly 0, whatever it held.
    """
    logits = jnp.where(mask[:, None], logits, jnp.zeros_like(logits))
    labels = jnp.where(mask, labels, jnp.zeros_like(labels))
    return logits, labels


# ---------------------------------------------------------------------------
# Gathers and first indices.
# ---------------------------------------------------------------------------


def take_col(x: jax.Array, idx: jax.Array) -> jax.Array:
    """``x[b, idx[b]]`` as ``[B]``; the gradient goes to that one entry."""
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def first_index(x: jax.Array, value: jax.Array) -> jax.Array:
    """First column ``k`` with ``x[b, k] == value[b]``, int32 ``[B]``.

    ``value`` must be attained in every row (a row max or min). A ``where``
    plus an integer min over the classes; on XLA:CPU about 4x faster than
    ``jnp.argmax`` at (4096, 1000).
    """
    cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    first = jnp.min(jnp.where(x == value[:, None], cols, x.shape[1]), axis=1)
    return lax.stop_gradient(first)


# ---------------------------------------------------------------------------
# True class versus the rest (kernel family 'loss_true_vs_rest'): the focal
# family and the Brier score. Writing d = z_y - log sum_{k != y} e^{z_k},
# log p_y = log sigmoid(d) and log(1 - p_y) = log sigmoid(-d) are finite with
# finite gradients for every finite logit vector (K >= 2), including p_y that
# rounds to 0 or 1. Computing 1 - p_y as 1 - exp(log p_y) instead loses it to
# rounding once p_y > 1 - 1e-7, and (1 - p_y)^gamma then has a NaN gradient.
# ---------------------------------------------------------------------------


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
    r"""True-class-versus-rest statistics at about the cost of a log-sum-exp.

    Two max passes and one exponential pass over ``[B, K]`` (plus a sum of
    squares for ``squares``), and no comparison of the class index with the
    label (costly on XLA:CPU). The exponentials are written once and reused by
    the gradient. The shift is the largest non-true logit
    :math:`r = \max_{k \ne y} z_k`: the row max :math:`m`, or, when :math:`y`
    is the unique maximum, the largest logit below it (both from a float
    compare with :math:`m`). With :math:`c_k =
    e^{\min(z_k - r,\, 0)}` (the clamp changes only :math:`c_y`, the one entry
    that can exceed :math:`r`),

    .. math::

        \sum_{k \ne y} e^{z_k - r} = \sum_k c_k - c_y \ge 1,

    a sum that holds :math:`e^0 = 1` minus a term :math:`c_y \le 1`, so the
    subtraction loses at most a few ulps however close :math:`p_y` is to 0 or
    1, and nothing overflows or underflows to 0.

    The derivative is a ``custom_jvp`` rule (all orders): :math:`r` is a
    constant (log-sum-exp is shift invariant) and the sums move with
    :math:`\sum_k c_k\,dz_k - c_y\,dz_y` (and twice that with :math:`c^2`).
    Its transpose, the gradient, is one elementwise ``[B, K]`` pass plus an
    in-place scatter of the label term (a gather in the rule), as for
    cross-entropy.

    Kernel family ``'loss_true_vs_rest'`` (:mod:`calib_jax.kernels`): the
    plain formulation is :func:`rest_parts_plain`; float64 references
    ``ref_focal``, ``ref_focal_adaptive``, ``ref_inverse_focal`` and
    ``ref_brier`` in ``tests/_reference.py``.
    """
    parts = kernels.select(
        "loss_true_vs_rest",
        lambda z, y: rest_parts(z, y, squares),
        functools.partial(rest_parts_plain, squares=squares),
        logits,
        labels,
    )
    return Split(*parts)


def rest_parts_plain(z, labels, *, squares):
    """Plain :func:`rest_parts`: a masked log-sum-exp with JAX autodiff."""
    z_true = take_col(z, labels)
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    # The shift is a constant (log-sum-exp is shift invariant).
    rest_max = lax.stop_gradient(jnp.max(rest, axis=1))
    e = jnp.exp(rest - rest_max[:, None])
    rest_sq = jnp.sum(e * e, axis=1) if squares else None
    return z_true, rest_max, jnp.sum(e, axis=1), rest_sq


def clamped_exp(s: jax.Array) -> jax.Array:
    """``exp(min(s, 0))`` whose derivative at ``s == 0`` is that of ``exp``."""
    return jnp.exp(jnp.where(s > 0, jnp.zeros_like(s), s))


def max_rest_logit(z: jax.Array, z_true: jax.Array) -> jax.Array:
    """``max_{k != y} z_k`` per row, ``[B]``, without a compare with the label.

    The row max, or the largest logit below it when the label is the unique
    maximum: a library max pass plus one fused loop for the largest logit
    below the max and the number of maxima (a finite sentinel: an infinite one
    makes XLA:CPU emit a scalar loop). No derivative is taken through it.
    """
    finfo = jnp.finfo(z.dtype)
    # The row max is its own reduction (see unfused).
    m = unfused(jnp.max(z, axis=1))
    below = z < m[:, None]
    second, n_top = row_reduce(
        (jnp.where(below, z, finfo.min), jnp.where(below, 0, 1).astype(jnp.int32)),
        (finfo.min, 0),
        (lax.max, lax.add),
    )
    return jnp.where((z_true >= m) & (n_top == 1), second, m)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def rest_parts(z, labels, squares):
    """``(z_true, z_rest_max, rest_sum, rest_sq_sum or None)``; see
    :func:`true_vs_rest`."""
    z_true = take_col(z, labels)
    rest_max = max_rest_logit(z, z_true)
    # The same expressions as in the rule below, so that XLA computes the
    # exponentials once, writes them out and reuses them for the gradient (as
    # it does for cross-entropy's softmax).
    c = clamped_exp(z - rest_max[:, None])
    c_true = clamped_exp(z_true - rest_max)
    rest_sq = None
    if squares:
        # Squares of the stored exponentials: the barrier (no value change)
        # stops XLA:CPU from recomputing them as exp(2 s); the two-output
        # reduction sums them in one read of c, without writing c * c out.
        c = lax.optimization_barrier(c)
        sq, n_ge = row_reduce(
            (c * c, jnp.where(c < 1.0, 0, 1).astype(jnp.int32)),
            (0, 0),
            (lax.add, lax.add),
        )
        # n_ge >= 1 (the largest other logit gives c = e^0 = 1), so this
        # select changes no value; using n_ge keeps the reduction two-output.
        sq = jnp.where(n_ge > 0, sq, jnp.full_like(sq, jnp.nan))
        rest_sq = sq - c_true * c_true
    rest = jnp.sum(c, axis=1) - c_true
    return z_true, rest_max, rest, rest_sq


@rest_parts.defjvp
def _rest_parts_jvp(squares, primals, tangents):
    z, labels = primals
    dz, _ = tangents
    out = rest_parts(z, labels, squares)
    z_true, rest_max = out[0], lax.stop_gradient(out[1])
    c = clamped_exp(z - rest_max[:, None])
    c_true = clamped_exp(z_true - rest_max)
    dz_true = take_col(dz, labels)
    drest = jnp.sum(c * dz, axis=1) - c_true * dz_true
    drest_sq = None
    if squares:
        c = lax.optimization_barrier(c)  # as in the primal: c * c, not exp(2 s)
        drest_sq = 2.0 * (jnp.sum(c * c * dz, axis=1) - c_true * c_true * dz_true)
    return out, (dz_true, jnp.zeros_like(rest_max), drest, drest_sq)


# ---------------------------------------------------------------------------
# Softmax row statistics (kernel family 'loss_rows'): the batch-level losses.
# ---------------------------------------------------------------------------


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
    formulation is :func:`row_stats_plain`; float64 references ``ref_csf``
    and every ``ref_*`` batch-level loss in ``tests/_reference_batch.py``.

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
        functools.partial(row_stats_fused, **flags),
        functools.partial(row_stats_plain, **flags),
        logits,
        ids,
    )
    if "correct" in outs:
        outs["correct"] = lax.stop_gradient(outs["correct"])
    return Rows(**{name: outs.get(name) for name in Rows._fields})


def row_stats_plain(x, labels, *, has_labels, ce, conf, entropy, margin):
    """Plain formulation of :func:`row_stats` (kernel family ``'loss_rows'``).

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


def row_stats_fused(x, labels, *, has_labels, ce, conf, entropy, margin):
    """The one-pass ``custom_jvp`` kernel of :func:`row_stats`."""
    want_top = conf or margin

    def forward(x, labels):
        # The row max is its own reduction; unfused keeps XLA:CPU from fusing
        # the broadcast ``x - max`` into it and writing ``s`` out as a [B, K]
        # array next to ``e`` (measured at (4096, 1000): the exponential then
        # runs as a separate, slower single-op loop).
        m = unfused(jnp.max(x, axis=-1))
        s = x - m[:, None]
        e = jnp.exp(s)
        # With labels, the first index of an exact maximum (s == 0, what
        # jnp.argmax returns) rides in the same variadic reduction.
        count = (
            functools.partial(sum_top_count_first, s=s)
            if has_labels
            else sum_and_top_count
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
def sum_and_top_count(v: jax.Array, e: jax.Array):
    """``(sum_k v_k, #{k: e_k == 1})`` per row from one variadic reduction.

    ``e = exp(s)`` with ``s <= 0``, so ``e >= 1`` marks the maxima (see
    :func:`row_stats`); the count is int32. XLA:CPU emits the pair as one
    vectorised loop over the classes that also computes ``v`` and ``e`` (see
    :func:`row_reduce`). The rule keeps the sum differentiable (higher
    derivatives of :func:`row_stats` go through it).
    """
    return row_reduce((v, (e >= 1.0).astype(jnp.int32)), (0, 0), (lax.add, lax.add))


@sum_and_top_count.defjvp
def _sum_and_top_count_jvp(primals, tangents):
    (v, e), (dv, _) = primals, tangents
    out = sum_and_top_count(v, e)
    return out, (jnp.sum(dv, axis=-1), no_tangent(out[1]))


@jax.custom_jvp
def sum_top_count_first(v: jax.Array, e: jax.Array, s: jax.Array):
    """:func:`sum_and_top_count` plus the first index with ``s == 0`` (the
    first exact maximum, int32; ``K`` for a row without one), from the same
    variadic reduction."""
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


def safe_pow(x: jax.Array, exponent) -> jax.Array:
    """``x ** exponent`` for ``x >= 0`` with value 0 and gradient 0 at ``x == 0``.

    Used for the p-th powers and p-th roots of the ECE family and the square root
    of MMCE, whose derivative is unbounded at 0 (the subgradient 0 is taken).
    """
    pos = x > 0
    safe = jnp.where(pos, x, jnp.ones_like(x))
    return jnp.where(pos, safe**exponent, jnp.zeros_like(x))


# ---------------------------------------------------------------------------
# Dual focal (kernel family 'loss_dual_focal').
# ---------------------------------------------------------------------------


@jax.custom_jvp
def dual_parts(z, labels):
    """``(z_true, z_rest_max, rest_sum, first)`` per row.

    ``z_y``, ``max_{k != y} z_k``, ``sum_{k != y} exp(z_k - z_rest_max)`` and
    the first arg-max among the non-true classes (int32). The maximum comes
    from :func:`max_rest_logit` (no compare with the label), the sum is
    ``sum_k c_k - c_y`` with ``c = exp(min(z - z_rest_max, 0))`` as in
    :func:`true_vs_rest` (``>= 1`` minus a term ``<= 1``: nothing
    cancels), and one fused reduction over the stored ``c`` gives the sum and
    the arg-max (see :func:`row_reduce`). ``z_rest_max`` carries the
    gradient of its first arg-max; the derivative of ``rest_sum`` holds
    ``z_rest_max`` fixed, so ``stop_gradient(z_rest_max) + log(rest_sum)`` is
    the log-sum-exp with its exact derivatives (all orders). The backward pass
    is one elementwise pass over ``c`` plus two in-place scatters (the label
    and the arg-max entries, gathers in the rule).

    Kernel family ``'loss_dual_focal'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`dual_parts_plain`; float64 reference
    ``ref_dual_focal`` in ``tests/_reference.py``.
    """
    k = z.shape[1]
    z_true = take_col(z, labels)
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


def dual_parts_plain(z, labels):
    """Plain :func:`dual_parts`: masked ``argmax`` and log-sum-exp, autodiff."""
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    first = jnp.argmax(rest, axis=1).astype(jnp.int32)
    z_rest_max = take_col(z, first)  # moves with the first arg-max
    # The shift is a constant (the sum is taken with z_rest_max held fixed).
    e = jnp.exp(rest - lax.stop_gradient(z_rest_max)[:, None])
    return take_col(z, labels), z_rest_max, jnp.sum(e, axis=1), first


@dual_parts.defjvp
def _dual_parts_jvp(primals, tangents):
    z, labels = primals
    dz, _ = tangents
    out = dual_parts(z, labels)
    z_true, z_rest_max, _, first = out
    shift = lax.stop_gradient(z_rest_max)
    c = clamped_exp(z - shift[:, None])
    dtrue = take_col(dz, labels)
    drest_sum = jnp.sum(c * dz, axis=1) - clamped_exp(z_true - shift) * dtrue
    return out, (dtrue, take_col(dz, first), drest_sum, no_tangent(first))


# ---------------------------------------------------------------------------
# MbLS and ACLS (kernel families 'loss_mbls' and 'loss_acls').
# ---------------------------------------------------------------------------


@jax.custom_jvp
def mbls_parts(z, margin):
    """``(top, hinge, count, first)`` per row: the max logit, the hinge sum
    ``sum_k ReLU(top - z_k - margin)``, the number of active hinges (int32) and
    the first arg-max (int32).

    One max pass and one fused pass over ``[B, K]``; the derivative is stated
    in the rule below (``top`` moves with the first arg-max), so the backward
    pass is a single elementwise pass.

    Kernel family ``'loss_mbls'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`mbls_parts_plain`; float64 reference ``ref_mbls``
    in ``tests/_reference.py``.
    """
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


def _first_max(z):
    """``(max_k z_k, first arg-max)``; the max moves with the first arg-max."""
    first = jnp.argmax(z, axis=1).astype(jnp.int32)
    return take_col(z, first), first


def mbls_parts_plain(z, margin):
    """Plain :func:`mbls_parts`: ``argmax`` and a ReLU sum, JAX autodiff."""
    top, first = _first_max(z)
    gap = top[:, None] - z - margin
    active = gap > 0
    hinge = jnp.sum(jnp.where(active, gap, 0.0), axis=1)
    return top, hinge, jnp.sum(active.astype(jnp.int32), axis=1), first


@mbls_parts.defjvp
def _mbls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = mbls_parts(z, margin)
    top, _, count, first = out
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    active = top[:, None] - z - margin > 0
    dtop = jnp.sum(jnp.where(cols == first[:, None], dz, 0.0), axis=1)
    # d sum_{k active} (top - z_k - m) = count (dtop - dm) - sum_{k active} dz_k.
    dhinge = count.astype(z.dtype) * (dtop - dmargin) - jnp.sum(
        jnp.where(active, dz, 0.0), axis=1
    )
    return out, (dtop, dhinge, no_tangent(count), no_tangent(first))


@jax.custom_jvp
def acls_parts(z, margin):
    """Per-row statistics of ACLS, Eq. (13): ``(top, low, hinge, neg, first_max,
    first_min, count)``.

    ``top``/``low`` are the max/min logits, ``hinge = sum_j ReLU(g_j)`` and
    ``neg = sum_j ReLU(g_j)^2`` with ``g_j = top - z_j - margin`` (the
    ``j = argmax`` term is ``ReLU(-M)^2 = 0``, so summing over all ``j`` is
    exact), then the first arg-max, the first arg-min and the number of active
    hinges (int32). Three fused passes over ``[B, K]``; the derivative is
    stated in the rule below (``top``/``low`` move with the first
    arg-max/arg-min), so the backward pass is a single elementwise pass.

    Kernel family ``'loss_acls'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`acls_parts_plain`; float64 reference ``ref_acls``
    in ``tests/_reference.py``.
    """
    k = z.shape[1]
    top, low = row_reduce((z, z), (-jnp.inf, jnp.inf), (lax.max, lax.min))
    gap = top[:, None] - z - margin
    active = gap > 0
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    # One float sum per reduction (see row_reduce), grouped so that under
    # value_and_grad every reduction keeps at least two used outputs (count
    # only feeds the derivative of hinge, which a first-order gradient drops).
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


def acls_parts_plain(z, margin):
    """Plain :func:`acls_parts`: ``argmax``/``argmin`` and ReLU sums, autodiff."""
    top, first_max = _first_max(z)
    first_min = jnp.argmin(z, axis=1).astype(jnp.int32)
    low = take_col(z, first_min)
    gap = top[:, None] - z - margin
    active = gap > 0
    relu_gap = jnp.where(active, gap, 0.0)
    hinge = jnp.sum(relu_gap, axis=1)
    neg = jnp.sum(relu_gap * relu_gap, axis=1)
    count = jnp.sum(active.astype(jnp.int32), axis=1)
    return top, low, hinge, neg, first_max, first_min, count


@acls_parts.defjvp
def _acls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = acls_parts(z, margin)
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


# ---------------------------------------------------------------------------
# MDCA (kernel family 'loss_mdca').
# ---------------------------------------------------------------------------


@jax.custom_jvp
def prob_sums(x, w):
    r"""``sum_i w_i softmax(x_i)``, ``[K]``, from one exponential pass.

    The row max, the exponentials ``e`` (written once), the row sums ``z`` and
    the weighted column sums of ``e / z`` as a vector-matrix product. The rule
    states the derivative

    .. math::  dP_k = \sum_i w_i p_{ik} (t_{ik} - \textstyle\sum_j p_{ij} t_{ij})
        + \sum_i p_{ik}\, dw_i,

    written with products against ``e``, so that its transpose (the gradient
    ``w_i p_ik (a_k - sum_j p_ij a_j)``) is one matrix-vector product and one
    elementwise pass over ``e``, instead of autodiff's softmax backward through
    the division and the shifted maximum.

    Kernel family ``'loss_mdca'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`prob_sums_plain`; float64 reference ``ref_mdca``
    in ``tests/_reference_batch.py``.
    """
    return _prob_parts(x, w)[0]


def prob_sums_plain(x, w):
    """Plain :func:`prob_sums`: ``jax.nn.softmax`` and autodiff (f32 sums)."""
    return jnp.sum(w[:, None] * jax.nn.softmax(x, axis=-1), axis=0)


def _prob_parts(x, w):
    # The shift is a constant (softmax is shift invariant); unfused keeps it a
    # reduction of its own, so that XLA:CPU does not write x - max out.
    m = unfused(jnp.max(x, axis=-1))
    e = jnp.exp(x - m[:, None])
    z = jnp.sum(e, axis=-1)
    return _vecmat(w / z, e), e, z


def _vecmat(v, a):
    """``sum_i v_i a_ik`` at full float precision, ``[K]``."""
    return jnp.dot(v, a, precision=lax.Precision.HIGHEST)


@prob_sums.defjvp
def _prob_sums_jvp(primals, tangents):
    x, w = primals
    t, dw = tangents
    sums, e, z = _prob_parts(x, w)
    c = w / z  # p_ik w_i = c_i e_ik
    p_t = jnp.sum(e * t, axis=-1) / z  # sum_k p_ik t_ik
    dsums = jnp.sum(c[:, None] * e * t, axis=0) - _vecmat(c * p_t, e)
    dsums = dsums + _vecmat(dw / z, e)
    return sums, dsums


# ---------------------------------------------------------------------------
# Tie groups of sorted keys (kernel family 'sort_keys'): AURC.
# ---------------------------------------------------------------------------


def _tie_groups(key):
    """``(first, new_group)`` of ascending ``key``: each sample's first sorted
    position in its tie group (binary search), and the group starts."""
    key_sorted = lax.sort(key)
    first = jnp.searchsorted(key_sorted, key, side="left", method="scan")
    new_group = jnp.concatenate(
        [jnp.ones((1,), bool), key_sorted[1:] != key_sorted[:-1]]
    )
    return first, new_group


def tie_groups_packed(x):
    """:func:`_tie_groups` of the floats ``x`` sorted as integer keys (no
    payload; several times faster on XLA:CPU than sorting (score, loss) pairs).
    Kernel family ``'sort_keys'`` (:mod:`calib_jax.kernels`); plain:
    :func:`tie_groups_plain`; float64 reference ``ref_aurc`` in
    ``tests/_reference_batch.py``."""
    return _tie_groups(_sortable(x))


def tie_groups_plain(x):
    """Plain :func:`tie_groups_packed`: the float keys themselves."""
    return _tie_groups(x)


def _sortable(x: jax.Array) -> jax.Array:
    """Signed integers ordered as the floats ``x`` (no NaN, no -0.0), ``[B]``."""
    itype = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
    bits = lax.bitcast_convert_type(x, itype)
    # Negative floats order by decreasing magnitude: flip all but the sign bit.
    return jnp.where(bits < 0, bits ^ jnp.iinfo(itype).max, bits)
