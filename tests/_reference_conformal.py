"""Float64 NumPy references for ``calib_jax.conformal``, from the papers' definitions.

Plain array code, no JAX and no sorting for the scores: the mass ranked before
a class and its rank are counted by pairwise comparison, as the papers define
them (RAPS, Sec. 2: rho_x(y) = sum of the probabilities larger than pi_x(y),
o_x(y) = number of classes at least as likely). Ties are broken by class index
(lower first) when ``ties='index'``, the library's documented convention.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def softmax(logits):
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def thr_scores(probs):
    """``[N, K]``: 1 - pi_x(y) for every class."""
    return 1.0 - np.asarray(probs, np.float64)


def raps_scores(probs, u=None, lam=0.0, k_reg=0, ties="index"):
    """``[N, K]``: rho_x(y) + u pi_x(y) + lam (o_x(y) - k_reg)^+ for every class.

    ``ties='index'``: a class of equal probability and lower index ranks
    before; ``ties='paper'``: the papers' strict/non-strict comparisons.
    """
    p = np.asarray(probs, np.float64)
    n, k = p.shape
    u = np.ones(n) if u is None else np.asarray(u, np.float64)
    pj = p[:, None, :]  # other class j
    py = p[:, :, None]  # scored class y
    if ties == "index":
        j_before = np.arange(k)[None, None, :] < np.arange(k)[None, :, None]
        ahead = (pj > py) | ((pj == py) & j_before)
        rho = np.sum(np.where(ahead, pj, 0.0), axis=2)
        rank = 1 + ahead.sum(axis=2)
    else:
        rho = np.sum(np.where(pj > py, pj, 0.0), axis=2)
        rank = (pj >= py).sum(axis=2)
    return rho + u[:, None] * p + lam * np.maximum(rank - k_reg, 0)


def rank(n, alpha):
    """ceil((n + 1)(1 - alpha)) with alpha read as its decimal repr."""
    return math.ceil((n + 1) * (1 - Fraction(repr(float(alpha)))))


def quantile(scores, alpha):
    """The ceil((n+1)(1-alpha))-th smallest score (numpy's inverted CDF)."""
    s = np.asarray(scores, np.float64)
    return float(np.quantile(s, rank(s.size, alpha) / s.size, method="inverted_cdf"))


def stratified_coverage(sets, labels, strata, where=None):
    """Coverage and count per inclusive size stratum (NaN when empty)."""
    sets = np.asarray(sets, bool)
    labels = np.asarray(labels)
    keep = np.ones(len(labels), bool) if where is None else np.asarray(where)
    sizes = sets.sum(axis=1)
    hit = sets[np.arange(len(labels)), labels]
    cov, cnt = [], []
    for lo, hi in strata:
        hi = np.inf if hi is None else hi
        m = keep & (sizes >= lo) & (sizes <= hi)
        cnt.append(int(m.sum()))
        cov.append(float(hit[m].mean()) if m.any() else np.nan)
    return np.array(cov), np.array(cnt)
