"""L-BFGS on an objective whose every evaluation is a pass over chunks:
:func:`minimize` replays :func:`calib_jax.posthoc._core.lbfgs_minimize` (the
in-memory fits' optimizer, compiled once) over a table of the evaluations made
so far (see :func:`_replay`).
"""

from __future__ import annotations

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


@jax.jit
def _replay(points, values, slopes, filled, u0, tol, max_iter, token):
    """:func:`_core.lbfgs_minimize` from ``u0`` on a table of evaluations.

    The objective is looked up in the first ``filled`` entries of
    ``(points, values, slopes)`` (value and derivative at ``u = log T``,
    matched bit for bit). A point the table lacks is reported to the host
    (:func:`_record_miss`) and gives NaN, which ends the run. The run is
    deterministic, so once the host has added that point, the next run
    repeats every step up to it and goes on: the last run, with no miss, is
    the L-BFGS of the in-memory fit on the objective the passes computed.
    """

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

    u, _ = _core.lbfgs_minimize(objective, u0, max_iter=max_iter, gtol=tol)
    return u


def minimize(evaluate, u0, *, max_iter, tol):
    """L-BFGS (the in-memory fit's) of ``evaluate: u -> (value, d/du)``, whose
    every call is a pass over the chunks, from ``u0``; returns ``u``.

    Runs :func:`_replay` until it asks for no new point: one pass per
    distinct point the optimizer evaluates, one cheap compiled run (scalar
    work) per pass.
    """
    token = next(_TOKENS)
    misses = _MISSES[token] = []
    size = _TABLE_SIZE
    table = np.zeros((3, size), np.float32)
    # The first point the optimizer asks for is u0: evaluated before any run
    # (the first pass of a fit checks the values before anything compiles).
    u0 = jnp.asarray(u0, jnp.float32)
    table[:, 0] = u0, *jax.device_get(evaluate(u0))
    filled = 1
    try:
        while True:
            misses.clear()
            u = _replay(*table, filled, u0, tol, max_iter, token)
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
