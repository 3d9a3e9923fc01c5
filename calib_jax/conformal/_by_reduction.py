r"""APS and RAPS by reductions over the class axis: the forms for a class
axis sharded over devices (``class_sharded=True`` in
:func:`calib_jax.conformal.raps_score`, ``raps_sets``, ``aps_score`` and
``aps_sets``).

The sorted forms of :mod:`calib_jax.conformal._scores` sort each row of
probabilities, which under class sharding gathers the whole ``[N, K]`` array
onto every device. Here every quantity is a row sum, a row count or a row
maximum over the classes, so each device reduces its own classes and the
devices add ``[N]`` partials. The conventions (ranking by decreasing
probability, ties by the lower class index; one uniform per row) are those
of the sorted forms (Romano et al. 2020, arXiv:2006.02544v1, Eq. (7);
Angelopoulos et al. 2021, arXiv:2009.14193v5, Sec. 2); the values equal
them to float32 rounding, the mass being added in class order rather than
in ranked order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


@functools.partial(jax.jit, static_argnames="k_reg")
def raps_score(probs, labels, u, lam, *, k_reg):
    r"""``conformal.raps_score`` by reductions over the class axis (jitted,
    no checks).

    The class-sharding form: with :math:`a_j = 1[\hat\pi_x(j) > \hat\pi_x(y)]
    \lor (\hat\pi_x(j) = \hat\pi_x(y) \land j < y)` (ranked before
    :math:`y`, the ties rule of the sorted form), :math:`\rho_x(y) = \sum_j
    a_j \hat\pi_x(j)` and :math:`o_x(y) = 1 + \sum_j a_j`: row sums only, so
    with the class axis sharded each device reduces its classes and the
    devices add ``[N]`` partials (no sort, no gather of the rows). Equal to
    the sorted form up to float32 rounding (the mass is added in class order,
    not in ranked order, and without its running maximum).
    """
    k = probs.shape[-1]
    idx = lax.iota(jnp.int32, k)[None, :]
    y = labels[:, None]
    p_y = jnp.sum(jnp.where(idx == y, probs, 0.0), axis=1)  # exact: one entry
    ahead = (probs > p_y[:, None]) | ((probs == p_y[:, None]) & (idx < y))
    before = jnp.sum(jnp.where(ahead, probs, 0.0), axis=1)
    rank = jnp.sum(ahead.astype(jnp.int32), axis=1) + 1
    weight = p_y if u is None else u * p_y
    excess = jnp.maximum(rank - k_reg, 0).astype(probs.dtype)
    return before + weight + jnp.asarray(lam, probs.dtype) * excess


def _ordered_keys(p):
    """uint32 keys that order like the non-negative float32 ``p``."""
    bits = lax.bitcast_convert_type(p.astype(jnp.float32) + 0.0, jnp.uint32)
    sign = jnp.uint32(0x80000000)
    return jnp.where(bits >= sign, ~bits, bits | sign)


@functools.partial(jax.jit, static_argnames="k_reg")
def raps_sets(probs, qhat, u, lam, *, k_reg):
    r"""``conformal.raps_sets`` by reductions over the class axis (jitted, no
    checks).

    The sets of the scores of :func:`raps_score`: the classes
    :math:`j` whose score, :math:`\sum_{i \prec j} \hat\pi_x(i) + u\,
    \hat\pi_x(j) + \lambda (o_x(j) - k_{reg})^+` with :math:`\prec` the
    ranking (decreasing probability, then increasing index), is at most
    :math:`\hat q`. A class's rank is the pair key :math:`(\hat\pi_x(j),
    K - 1 - j)`; the set is the classes whose key is at least the smallest
    key :math:`t^*` with a score at most :math:`\hat q`, found per row by
    bisection over the 32 bits of the probability and the bits of the index:
    each step evaluates, at the row's candidate key :math:`t`, the mass and
    count of the classes above it and the probability of the first class at
    or below it (three row reductions), with the very arithmetic of
    :func:`raps_score`, so ``label in set`` holds exactly when
    its score is at most ``qhat`` wherever the scores do not decrease along
    the ranking (they do not in exact arithmetic). No sort and no gather:
    with the class axis sharded the devices add ``[N]`` partials per step.
    """
    n, k = probs.shape
    dtype = probs.dtype
    hi = _ordered_keys(probs)
    lo = (k - 1 - lax.iota(jnp.int32, k)).astype(jnp.uint32)[None, :]
    lam = jnp.asarray(lam, dtype)
    qhat = qhat.astype(dtype)

    def inside(t_hi, t_lo):
        """Per row: is the first class at or below key ``t`` in the set?"""
        above = (hi > t_hi[:, None]) | ((hi == t_hi[:, None]) & (lo > t_lo[:, None]))
        before = jnp.sum(jnp.where(above, probs, 0.0), axis=1)
        rank = jnp.sum(above.astype(jnp.int32), axis=1) + 1
        p_j = jnp.max(jnp.where(above, -1.0, probs), axis=1)
        weight = p_j if u is None else u * p_j
        excess = jnp.maximum(rank - k_reg, 0).astype(dtype)
        fits = before + weight + lam * excess <= qhat
        return fits, p_j < 0.0  # (in the set, no class at or below t)

    # The last class of the ranking: below its key there is no class, and
    # every key below it answers as it does.
    h_min = jnp.min(hi, axis=1)
    l_min = jnp.min(jnp.where(hi == h_min[:, None], lo, jnp.uint32(k)), axis=1)
    last_in, _ = inside(h_min, l_min)

    def predicate(t_hi, t_lo):
        fits, empty = inside(t_hi, t_lo)
        return jnp.where(empty, last_in, fits)

    def hi_step(i, ans):
        half = jnp.left_shift(jnp.uint32(1), (31 - i).astype(jnp.uint32))
        ok = predicate(ans + (half - 1), jnp.full((n,), 0xFFFFFFFF, jnp.uint32))
        return jnp.where(ok, ans, ans + half)

    t_hi = lax.fori_loop(0, 32, hi_step, jnp.zeros((n,), jnp.uint32))
    bits = max(k - 1, 1).bit_length()

    def lo_step(i, ans):
        half = jnp.left_shift(jnp.uint32(1), (bits - 1 - i).astype(jnp.uint32))
        ok = predicate(t_hi, ans + (half - 1))
        return jnp.where(ok, ans, ans + half)

    t_lo = lax.fori_loop(0, bits, lo_step, jnp.zeros((n,), jnp.uint32))
    member = (hi > t_hi[:, None]) | ((hi == t_hi[:, None]) & (lo >= t_lo[:, None]))
    # No key has a score within qhat: the bisection ran past every key.
    return member & predicate(t_hi, t_lo)[:, None]
