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
import optax
from jax import lax

# Bracket search after an L-BFGS run that bracketed nothing: the first
# probe's distance relative to 1 + |u| (or the last step, if larger) and the
# number of probes at most.
_FIRST_PROBE = 1e-5
_PROBES = 16
# L-BFGS hands over to the root search after a line search of more steps.
_STALL = 4


def minimize_log_t(fun, u0, *, max_iter, gtol, xtol=1e-7, memory_size=10):
    r"""Local minimum of the scalar ``fun`` of a scalar ``u``, downhill of ``u0``.

    1. L-BFGS (the iterations of :func:`._core.lbfgs_minimize`) until
       :math:`|f'| \le` ``gtol`` (returned), a non-finite value (the last
       finite point returned), a step at most ``xtol * (1 + |u|)``,
       ``max_iter`` iterations, an iteration whose line search took more
       than 4 steps (:math:`f'` is not smooth there: each further one
       costs an evaluation and gains little), or a downhill step across
       which :math:`f'` changes sign (a minimum between the two iterates).
    2. Without that bracket: probes downhill of the end point, first at
       :math:`10^{-5}(1 + |u|)` (or the last step if larger), then by the
       distance to the root of the secant of the last two slopes, between
       1/4 and 8 times the previous step, until :math:`f'` changes sign, at
       most ``min(max_iter, 16)`` probes. No sign change: the last finite
       probe is returned (still downhill).
    3. Root: secant steps on :math:`f'` inside the bracket, bisection where
       a secant step would leave it or not shrink (Brent 1973, Ch. 4), at
       most ``max_iter`` steps, until :math:`|f'| \le` ``gtol`` at a point
       (returned) or the bracket is at most ``xtol * (1 + |u|)`` wide (its
       midpoint returned).

    A smooth minimum (SB-ECE with :math:`p = 2`) usually ends in step 1, as
    plain L-BFGS. At a kink (:math:`p = 1`) :math:`f'` never reaches
    ``gtol``; steps 2-3 use only the sign and size of :math:`f'`, which
    float32 holds to far better relative precision there than :math:`f`,
    and end where :math:`f'` jumps across 0. Jittable; ``max_iter`` may be
    traced. Returns ``u``.
    """
    u0 = jnp.asarray(u0)
    grad = jax.grad(fun)
    u, g, u_prev, g_prev, bracketed = _lbfgs_until_bracket(
        fun, u0, max_iter, gtol, xtol, memory_size
    )
    stop = (jnp.abs(g) <= gtol) | ~jnp.isfinite(g)
    first = jnp.maximum(jnp.abs(u - u_prev), _FIRST_PROBE * (1.0 + jnp.abs(u)))
    a, ga, b, gb, found = _bracket(
        grad, u, g, u_prev, g_prev, first, gtol, max_iter, stop | bracketed
    )
    found = ~stop & (bracketed | found)
    skip = ~found | (jnp.abs(gb) <= gtol)
    root = _root(grad, a, ga, b, gb, gtol, xtol, max_iter, skip)
    return jnp.where(skip, b, root).astype(u0.dtype)


def _lbfgs_until_bracket(fun, u0, max_iter, gtol, xtol, memory_size):
    """``(u, f'(u), u_prev, f'(u_prev), bracketed)`` at the end of step 1;
    ``f'(u)`` NaN after a non-finite value."""
    dtype = u0.dtype
    given = fun

    def fun(x):
        # optax's line search steps are float64 in 64-bit mode; the objective
        # sees the dtype of u0 (as in _core.lbfgs_minimize).
        return given(jnp.asarray(x).astype(dtype))

    opt = optax.lbfgs(memory_size=memory_size)
    value_and_grad = optax.value_and_grad_from_state(fun)

    def cond(carry):
        *_, it, done = carry
        return (it < max_iter) & ~done

    def body(carry):
        x, state, _, _, _, it, _ = carry
        value, g = value_and_grad(x, state=state)
        updates, state = opt.update(g, state, x, value=value, grad=g, value_fn=fun)
        x_new = optax.apply_updates(x, updates)
        g_new = optax.tree.get(state, "grad")
        bad = ~jnp.isfinite(optax.tree.get(state, "value")) | ~jnp.isfinite(g_new)
        small_grad = jnp.abs(g_new) <= gtol
        small_step = jnp.abs(updates) <= xtol * (1.0 + jnp.abs(x_new))
        bracket = (g * g_new < 0) & ((x_new - x) * g < 0)
        # A non-finite trial point is not accepted; its NaN slope ends the fit.
        x_new = jnp.where(bad, x, x_new)
        g_new = jnp.where(bad, jnp.nan, g_new)
        # A line search of many steps: f' is not smooth here (a kink).
        stalled = optax.tree.get(state, "num_linesearch_steps") > _STALL
        done = bad | small_grad | small_step | bracket | stalled
        return x_new, state, x, g, g_new, it + 1, done

    # Slopes start at 0: max_iter >= 1 iterations replace them.
    zero = jnp.zeros((), dtype)
    no = jnp.zeros((), bool)
    carry = (u0, opt.init(u0), u0, zero, zero, jnp.zeros((), jnp.int32), no)
    u, _, u_prev, g_prev, g, _, _ = lax.while_loop(cond, body, carry)
    u, u_prev = u.astype(dtype), u_prev.astype(dtype)
    g, g_prev = g.astype(dtype), g_prev.astype(dtype)
    bracketed = (g * g_prev < 0) & ((u - u_prev) * g_prev < 0)
    return u, g, u_prev, g_prev, bracketed


def _bracket(grad, u, g, u_prev, g_prev, first, gtol, max_iter, skip):
    """``(a, f'(a), b, f'(b), found)``: ``(u_prev, u)`` when ``skip``, else
    the last two probes downhill of ``u``; ``found`` when the slope at ``b``
    is within ``gtol`` of 0 or of the sign opposite ``g``'s."""
    direction = -jnp.sign(g)
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
        c = b + direction * jnp.where(k == 0, first, step).astype(b.dtype)
        gc = grad(c)
        finite = jnp.isfinite(gc)
        found = finite & ((gc * g <= 0) | (jnp.abs(gc) <= gtol))
        a, ga = jnp.where(finite, b, a), jnp.where(finite, gb, ga)
        b, gb = jnp.where(finite, c, b), jnp.where(finite, gc, gb)
        return a, ga, b, gb, k + 1, found | ~finite

    carry = (u_prev, g_prev, u, g, jnp.zeros((), jnp.int32), skip)
    a, ga, b, gb, _, _ = lax.while_loop(cond, body, carry)
    found = jnp.isfinite(gb) & ((gb * g <= 0) | (jnp.abs(gb) <= gtol))
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
