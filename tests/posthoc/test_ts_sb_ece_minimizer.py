"""TS-SB-ECE (Karandikar et al. 2021, Sec. 5.2, App. C): the in-memory and the
streamed fit reach the float64 minimizer of SB-ECE_lb,p (Eq. (12)) in T, and
the derivative-driven 1-D search they share finds kinks and roots that float32
objective values cannot resolve."""

from __future__ import annotations

import functools
import math

import _reference_batch
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from calib_jax import posthoc
from calib_jax.posthoc import _log_t_search

N, K, M, T_SB = 1000, 10, 15, 0.01


def _logits(seed=2):
    """Over-confident bf16 classifier logits (as test_posthoc_streamed's)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, N)
    z = 2.0 * rng.standard_normal((N, K))
    right = rng.random(N) < 0.85
    top = np.where(right, labels, (labels + rng.integers(1, K, N)) % K)
    z[np.arange(N), top] += 7.0
    return z.astype(np.float32).astype(ml_dtypes.bfloat16), labels


def _sb_ece64(z, labels, t, p):
    """SB-ECE_lb,p (Eqs. (8)-(10), (12)) of softmax(z / t) in float64,
    vectorised over rows (checked against ``_reference_batch.ref_sb_ece``)."""
    s = z / t
    e = np.exp(s - s.max(axis=1, keepdims=True))
    probs = e / e.sum(axis=1, keepdims=True)
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    centres = (np.arange(M) + 0.5) / M
    score = -((conf[:, None] - centres) ** 2) / T_SB
    member = np.exp(score - score.max(axis=1, keepdims=True))
    member /= member.sum(axis=1, keepdims=True)
    acc = (member * correct[:, None]).sum(axis=0) / member.sum(axis=0)
    total = (member * np.abs(acc[None, :] - conf[:, None]) ** p).sum() / len(conf)
    return total ** (1.0 / p)


def _argmin64(f, lo, hi):
    """Minimizer of ``f`` over ``[lo, hi]`` in u: a 2001-point grid, a
    401-point grid over +-2 of its steps, then golden-section search."""
    grid = np.linspace(lo, hi, 2001)
    best = grid[np.argmin([f(u) for u in grid])]
    width = 2 * (grid[1] - grid[0])
    grid = np.linspace(best - width, best + width, 401)
    best = grid[np.argmin([f(u) for u in grid])]
    a, b = best - (grid[1] - grid[0]), best + (grid[1] - grid[0])
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    while b - a > 1e-12:
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        a, b = (a, d) if f(c) < f(d) else (c, b)
    return 0.5 * (a + b)


@pytest.mark.long
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_both_fits_reach_the_float64_minimizer(p):
    x, y = _logits()
    z = x.astype(np.float64)
    assert _sb_ece64(z, y, 1.3, p) == pytest.approx(
        _reference_batch.ref_sb_ece(z / 1.3, y, num_bins=M, temperature=T_SB, p=p),
        rel=1e-12,
    )
    u_star = _argmin64(lambda u: _sb_ece64(z, y, math.exp(u), p), -0.3, 0.7)
    t_star = math.exp(u_star)
    cuts = (0, 137, 2 * N // 3, N)
    pairs = [(x[a:b], y[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    streamed = posthoc.fit_of_chunks(
        "ts:sb_ece", pairs, chunk_rows=300, progress_bar=False, p=p
    )
    in_memory = posthoc.fit("ts:sb_ece", jnp.asarray(x), y, p=p)
    for cal in (streamed, in_memory):
        assert float(cal.params["temperature"]) == pytest.approx(t_star, rel=1e-5)
    if p == 1.0:
        # A kink: the float64 one-sided slopes at T* differ in sign.
        h = 1e-6

        def f(u):
            return _sb_ece64(z, y, math.exp(u), p)

        assert (f(u_star + h) - f(u_star)) / h > 1e-5
        assert (f(u_star) - f(u_star - h)) / h < -1e-5


_OBJECTIVES = (
    # A kink at 0.2 under a float32-flat value: 1 + 1e-8 |u - 0.2| rounds to
    # 1 wherever |u - 0.2| < 6, its slope does not (searched with gtol 1e-9).
    (lambda u: 1.0 + 1e-8 * jnp.abs(u - 0.2), 1e-9),
    # A kink at -0.4 next to the smooth part's minimum at -0.35.
    (lambda u: 0.3 * jnp.abs(u + 0.4) + 0.01 * (u + 0.35) ** 2, 1e-6),
    # A smooth root of f' at 0.7.
    (lambda u: jnp.log(jnp.cosh(3.0 * (u - 0.7))), 1e-6),
)


@jax.jit
def _search(fun_id, u0):
    branches = [
        functools.partial(_log_t_search.minimize_log_t, f, max_iter=100, gtol=gtol)
        for f, gtol in _OBJECTIVES
    ]
    return jax.lax.switch(fun_id, branches, u0)


@pytest.mark.parametrize(
    ("fun_id", "u0", "expected"),
    [(0, 1.3, 0.2), (0, -2.0, 0.2), (1, 0.9, -0.4), (1, -0.45, -0.4), (2, 0.0, 0.7)],
)
def test_search_ends_at_kinks_and_roots_of_the_derivative(fun_id, u0, expected):
    u = _search(fun_id, jnp.float32(u0))
    assert u.dtype == jnp.float32
    assert float(u) == pytest.approx(expected, abs=3e-7)
