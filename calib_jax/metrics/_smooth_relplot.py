r"""``smooth_ece(..., convention='relplot')``: relplot 1.0.3's smECE as released, on
grids of dynamic size (jittable search), and the grid rounding ``_smooth`` shares."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common


def predictions(probs, labels, target):
    """``(f, y)``: prediction and 0/1 outcome; top-label rows when ``labels`` None."""
    if labels is None:
        conf, correct = probs
        return conf.astype(jnp.float32), correct.astype(jnp.float32)
    if target == "top_label":
        conf, correct = _common.top_label(probs, labels)
        return conf.astype(jnp.float32), correct.astype(jnp.float32)
    p1 = _common.as_float(probs)[:, 1].astype(jnp.float32)
    return p1, (labels == 1).astype(jnp.float32)


def deposit(u, top, columns, size):
    """Linear rounding of masses to a grid, ``[size, C]``: ``u_i`` puts ``(1 - frac)
    v_i`` on ``lo = floor(u_i)`` (clipped to ``[0, top - 1]``) and ``frac v_i`` on
    ``lo + 1``, for each ``[N]`` column ``v``."""
    lo = jnp.clip(jnp.floor(u), 0.0, top - 1.0)
    frac = u - lo
    idx = jnp.concatenate([lo, lo + 1.0]).astype(jnp.int32)
    sums = [
        jax.ops.segment_sum(jnp.concatenate([(1.0 - frac) * v, frac * v]), idx, size)
        for v in columns
    ]
    return jnp.stack(sums, axis=1)


# smECE's ``eps``: a bandwidth below it satisfies the search predicate unevaluated.
_RELPLOT_EPS = 1e-3
_RELPLOT_STEPS = 10
# The smallest evaluated bisection midpoint (1/1024 < eps is not evaluated).
_RELPLOT_MIN_EVAL = 2.0 / 1024
# The scale whose grids bound those of a traced fixed bandwidth.
_RELPLOT_MIN_TRACED = 1e-3


def relplot_grid_sizes(sigma: float) -> tuple[int, int]:
    """relplot's ``(E, T)``: smoothing grid points and integral evaluation points."""
    return max(2000, round(20 / sigma)) // 2 + 1, max(round(10 / sigma), 200)


def _traced_sizes(sigma):
    e = jnp.maximum(2000, jnp.round(20.0 / sigma).astype(jnp.int32)) // 2 + 1
    t = jnp.maximum(jnp.round(10.0 / sigma).astype(jnp.int32), 200)
    return e, t


def _relplot_smece_at(f, columns, sigma, sizes, e_max, t_max):
    """relplot's ``smooth_ece(f, y, sigma)`` on grids of dynamic sizes.

    ``columns``: the residual ``f - y`` and ones (masked rows zero); ``sizes =
    (E, T)`` int32, at most the static ``e_max``, ``t_max``. As relplot 1.0.3
    (``kernels.py``): float32 rounding of ``f (E - 1)`` to the grid; the grid
    mirrored once at each end *without repeating the end points*, correlated
    (one FFT) with the Gaussian sampled at ``j/(E-1) - 1/2``, ``j < E``, and
    ``E`` outputs taken from ``E // 2``; linear interpolation to ``T`` points;
    ``sum |smoothed residual| / sum (smoothed count + 1e-4)``.
    """
    e, t = sizes
    e1 = (e - 1).astype(jnp.float32)
    values = deposit(f * e1, e1, columns, e_max)  # [e_max, 2]
    q = jnp.arange(3 * e_max, dtype=jnp.int32)
    src = jnp.where(
        q < e - 1, e - 1 - q, jnp.where(q < 2 * e - 1, q - (e - 1), 3 * e - 3 - q)
    )
    ext = jnp.where((q < 3 * e - 2)[:, None], values[jnp.clip(src, 0, e_max - 1)], 0.0)
    j = jnp.arange(e_max, dtype=jnp.float32)
    sigma = jnp.asarray(sigma, jnp.float32)
    dist = j / e1 - 0.5
    ker = jnp.exp(-dist * dist / (2.0 * sigma * sigma)) / (
        jnp.sqrt(2.0 * jnp.pi) * sigma
    )
    ker = jnp.where(j < e1 + 1.0, ker, 0.0)
    length = 4 * e_max
    spec = (
        jnp.fft.rfft(ext, n=length, axis=0)
        * jnp.conj(jnp.fft.rfft(ker, n=length))[:, None]
    )
    corr = jnp.fft.irfft(spec, n=length, axis=0)
    p = jnp.arange(e_max, dtype=jnp.int32)
    smoothed = corr[jnp.clip(e // 2 + p, 0, length - 1)]  # [e_max, 2]; p < E used
    i = jnp.arange(t_max, dtype=jnp.float32)
    tt = i / (t - 1).astype(jnp.float32)
    pos = tt * e1
    inds = jnp.clip(jnp.floor(pos), 0.0, e1 - 1.0)
    res = (pos - inds)[:, None]
    inds = inds.astype(jnp.int32)
    at_t = smoothed[inds] * (1.0 - res) + smoothed[inds + 1] * res  # [t_max, 2]
    inside = i < t.astype(jnp.float32)
    num = jnp.sum(jnp.where(inside, jnp.abs(at_t[:, 0]), 0.0))
    den = jnp.sum(jnp.where(inside, at_t[:, 1] + 1e-4, 0.0))
    return num / den


def _relplot_fixed_point(f, columns, e_max, t_max):
    """relplot's ``search_param``: 10 bisection steps on [0, 1], keeping
    the upper end; the predicate is ``sigma < eps or sigma < smECE_sigma``."""

    def predicate(sigma):
        evaluated = jnp.maximum(sigma, _RELPLOT_MIN_EVAL)
        value = _relplot_smece_at(
            f, columns, evaluated, _traced_sizes(evaluated), e_max, t_max
        )
        return (sigma < _RELPLOT_EPS) | (sigma < value)

    def step(_, bracket):
        start, end = bracket
        mid = 0.5 * (start + end)
        small = predicate(mid)
        return jnp.where(small, start, mid), jnp.where(small, mid, end)

    one = jnp.float32(1.0)
    start, _ = lax.fori_loop(0, _RELPLOT_STEPS, step, (one, jnp.float32(0.0)))
    return jnp.where(predicate(one), one, start)


@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _relplot_core(probs, labels, where, bandwidth, sizes, target, e_max, t_max):
    f, y = predictions(probs, labels, target)
    valid = _common.mask_or_ones(where, f.shape[0])
    columns = [jnp.where(valid, c, 0.0) for c in (f - y, jnp.ones_like(f))]
    if bandwidth is None:
        sigma = _relplot_fixed_point(f, columns, e_max, t_max)
        sizes = _traced_sizes(sigma)
    else:
        sigma = bandwidth
        if sizes is None:
            sizes = _traced_sizes(jnp.maximum(sigma, _RELPLOT_MIN_TRACED))
    return _relplot_smece_at(f, columns, sigma, sizes, e_max, t_max), sigma


def smooth_ece(probs, labels, where, bandwidth, bw, target):
    if bw is None:
        e_max, t_max = relplot_grid_sizes(_RELPLOT_MIN_EVAL)
        sizes = None
    elif _checks.is_concrete(bw):
        # The grids from the value as given (a Python float), as relplot.
        given = float(bandwidth) if np.ndim(bandwidth) == 0 else float(bw)
        e_max, t_max = relplot_grid_sizes(given)
        sizes = tuple(jnp.int32(v) for v in (e_max, t_max))
    else:
        e_max, t_max = relplot_grid_sizes(_RELPLOT_MIN_TRACED)
        sizes = None
    return _relplot_core(probs, labels, where, bw, sizes, target, e_max, t_max)
