r"""Minimising a 1-D objective of :math:`u = \log T` (TS-SB-ECE) by the sign of
its derivative: :func:`minimize_log_t`.

SB-ECE with :math:`p = 1` (Eq. (12) of Karandikar et al. 2021) has its
minimum at a kink (a row's confidence crossing its bin's accuracy), flat to
float32 resolution in value, so a search comparing float32 values stops where
rounding noise leads it; the derivative keeps its sign to within about
:math:`10^{-7}` in :math:`u` of the minimum. The in-memory and streamed fits
run this same function, so equal derivative signs give equal steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# Bracket search: the first probe's distance from u0, the cap of any one
# step and the number of probes at most.
_FIRST_STEP = 0.1
_MAX_STEP = 1.0
_PROBES = 16


def minimize_log_t(fun, u0, *, max_iter, gtol, xtol=1e-7):
    r"""Local minimum of the scalar ``fun`` of a scalar ``u``, downhill of ``u0``.

    1. Bracket: probes downhill of ``u0`` (first at distance 0.05, then by
       twice the distance to the root of the secant of the last two slopes,
       between 1/4 and 8 times the previous step, at most 1) until the slope
       changes sign, at most ``min(max_iter, 16)`` probes. No sign change:
       the last probe is returned (still downhill).
    2. Root: secant steps on :math:`f'` inside the bracket, bisection where
       a secant step would leave it or not shrink (Brent 1973, Ch. 4), at
       most ``max_iter`` steps, until :math:`|f'| \le` ``gtol`` at a
       point (returned) or the bracket is at most ``xtol * (1 + |u|)`` wide
       (its midpoint returned).

    Only the sign and size of :math:`f'` steer the search: float32 holds
    them to far better relative precision near a flat minimum than
    :math:`f`. It ends at a root of :math:`f'` or at a kink where
    :math:`f'` jumps across 0. Jittable; ``max_iter`` may be traced; a
    non-finite slope ends the search at the last finite point. Returns ``u``.
    """
    u0 = jnp.asarray(u0)
    grad = jax.grad(fun)
    g0 = grad(u0)
    a, ga, b, gb, found = _bracket(grad, u0, g0, gtol, max_iter)
    skip = ~found | (jnp.abs(gb) <= gtol)
    root = _root(grad, a, ga, b, gb, gtol, xtol, max_iter, skip)
    return jnp.where(skip, b, root).astype(u0.dtype)


def _bracket(grad, u0, g0, gtol, max_iter):
    """``(a, f'(a), b, f'(b), found)``: the last two points, ``found`` when
    the slope at ``b`` is within ``gtol`` of 0 or of the sign opposite
    ``g0``'s (a minimum between ``a`` and ``b``)."""
    direction = -jnp.sign(g0)
    limit = jnp.minimum(max_iter, _PROBES)

    def cond(carry):
        *_, k, done = carry
        return ~done & (k < limit)

    def body(carry):
        a, ga, b, gb, k, _ = carry
        last = jnp.abs(b - a)
        # Distance from b to the root of the line through both slopes, when
        # the slope shrinks towards 0.
        shrinks = jnp.abs(gb) < jnp.abs(ga)
        secant = jnp.abs(gb) * last / jnp.where(shrinks, jnp.abs(ga - gb), 1.0)
        step = jnp.where(shrinks, jnp.clip(secant, 0.25 * last, 8.0 * last), 4.0 * last)
        step = jnp.minimum(jnp.where(k == 0, _FIRST_STEP, step), _MAX_STEP)
        c = b + direction * step.astype(b.dtype)
        gc = grad(c)
        finite = jnp.isfinite(gc)
        found = finite & ((gc * g0 <= 0) | (jnp.abs(gc) <= gtol))
        a, ga = jnp.where(finite, b, a), jnp.where(finite, gb, ga)
        b, gb = jnp.where(finite, c, b), jnp.where(finite, gc, gb)
        return a, ga, b, gb, k + 1, found | ~finite

    done = (jnp.abs(g0) <= gtol) | ~jnp.isfinite(g0)
    carry = (u0, g0, u0, g0, jnp.zeros((), jnp.int32), done)
    a, ga, b, gb, _, _ = lax.while_loop(cond, body, carry)
    found = jnp.isfinite(gb) & ((gb * g0 <= 0) | (jnp.abs(gb) <= gtol))
    return a, ga, b, gb, found


def _root(grad, p0, g0, p1, g1, gtol, xtol, max_iter, skip):
    """A root of ``grad`` in the bracket ``[p0, p1]`` (either order, slopes
    ``g0``, ``g1`` of opposite signs): the secant step through the last two
    points where it falls inside the bracket and is under half the step
    before, else bisection (Brent 1973, Ch. 4)."""

    def cond(carry):
        *_, k, done = carry
        return ~done & (k < max_iter)

    def body(carry):
        lo, hi, p0, g0, p1, g1, _, k, _ = carry
        mid = lo + 0.5 * (hi - lo)
        slope = g1 - g0
        secant = p1 - g1 * (p1 - p0) / jnp.where(slope != 0, slope, 1.0)
        inside = (secant - lo) * (hi - secant) > 0
        short = jnp.abs(secant - p1) < 0.5 * jnp.abs(p1 - p0)
        r = jnp.where((slope != 0) & inside & short, secant, mid)
        gr = grad(r)
        finite = jnp.isfinite(gr)
        lo_new = jnp.where(gr < 0, r, lo)
        hi_new = jnp.where(gr < 0, hi, r)
        at_root = jnp.abs(gr) <= gtol
        width = jnp.abs(hi_new - lo_new)
        narrow = (width <= xtol * (1.0 + jnp.abs(r))) | (r == lo) | (r == hi)
        result = jnp.where(at_root, r, lo_new + 0.5 * (hi_new - lo_new))
        result = jnp.where(finite, result, mid)
        done = at_root | narrow | ~finite
        return lo_new, hi_new, p1, g1, r, gr, result, k + 1, done

    lo = jnp.where(g0 < 0, p0, p1)
    hi = jnp.where(g0 < 0, p1, p0)
    mid = lo + 0.5 * (hi - lo)
    carry = (lo, hi, p0, g0, p1, g1, mid, jnp.zeros((), jnp.int32), skip)
    return lax.while_loop(cond, body, carry)[6]
