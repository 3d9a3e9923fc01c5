"""A minimizer of an objective whose every evaluation is a pass over chunks: the
in-memory fits' optimizer replayed over a table of the evaluations made so far."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from calib_jax.posthoc import _core

# The points each running fit asked for and the table lacked, by fit token.
_MISSES: dict[int, list[float]] = {}
_TOKENS = itertools.count()
# Evaluations the first table holds (it doubles when full).
_TABLE_SIZE = 32


def _record_miss(token, u):
    _MISSES[int(token)].append(float(u))
    return np.zeros((), np.int32)


@functools.partial(jax.jit, static_argnames=("minimizer",))
def _replay(points, values, slopes, filled, u0, tol, max_iter, token, *, minimizer):
    """``minimizer`` from ``u0`` on the first ``filled``
    evaluations ``(points, values, slopes)``, matched bit for bit. A missing
    point is reported to the host and gives NaN, ending the run; the run is
    deterministic, so the next one repeats every step up to it."""

    def look(u):
        hit = (points == u) & (jnp.arange(points.shape[0]) < filled)
        found = jnp.any(hit)
        i = jnp.argmax(hit)
        jax.lax.cond(
            found,
            lambda: jnp.zeros((), jnp.int32),
            lambda: io_callback(
                _record_miss,
                jax.ShapeDtypeStruct((), jnp.int32),
                token,
                u,
                ordered=True,
            ),
        )
        nan = jnp.full((), jnp.nan, values.dtype)
        return jnp.where(found, values[i], nan), jnp.where(found, slopes[i], nan)

    @jax.custom_jvp
    def objective(u):
        return look(u)[0]

    @objective.defjvp
    def _(primals, tangents):
        value, slope = look(primals[0])
        return value, slope * tangents[0]

    return minimizer(objective, u0, max_iter=max_iter, gtol=tol)


def lbfgs(fun, u0, *, max_iter, gtol):
    """:func:`_core.lbfgs_minimize`'s ``u`` (the NLL fits' minimizer)."""
    return _core.lbfgs_minimize(fun, u0, max_iter=max_iter, gtol=gtol)[0]


def minimize(evaluate, u0, *, max_iter, tol, minimizer=lbfgs):
    """``minimizer(fun, u0, max_iter=, gtol=)`` (jittable, deterministic) of
    ``evaluate: u -> (value, d/du)`` from ``u0``: runs :func:`_replay` until
    it misses no point; returns ``u``."""
    token = next(_TOKENS)
    misses = _MISSES[token] = []
    size = _TABLE_SIZE
    table = np.zeros((3, size), np.float32)
    # u0 is evaluated first: that pass checks the values before any compile.
    u0 = jnp.asarray(u0, jnp.float32)
    table[:, 0] = u0, *jax.device_get(evaluate(u0))
    filled = 1
    try:
        while True:
            misses.clear()
            u = _replay(*table, filled, u0, tol, max_iter, token, minimizer=minimizer)
            jax.block_until_ready(u)
            jax.effects_barrier()
            if not misses:
                return u
            point = np.float32(misses[0])
            value, slope = jax.device_get(evaluate(jnp.asarray(point)))
            if filled == size:
                size *= 2
                table = np.concatenate([table, np.zeros_like(table)], axis=1)
            table[:, filled] = point, value, slope
            filled += 1
    finally:
        del _MISSES[token]
