"""Float64 NumPy/SciPy references for the post-hoc calibrators.

Written independently of ``calib_jax.posthoc``: plain array code, no JAX.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def nll(logits, labels, temperature=1.0, weights=None):
    """Mean (or weighted) NLL of softmax(logits / T), float64."""
    z = np.asarray(logits, np.float64) / float(temperature)
    y = np.asarray(labels)
    per = logsumexp(z, axis=1) - z[np.arange(len(y)), y]
    if weights is None:
        return float(per.mean())
    w = np.asarray(weights, np.float64)
    return float(np.sum(w * per) / np.sum(w))


def ts_nll_optimum_scipy(logits, labels, bounds=(0.05, 20.0)):
    """T minimising the NLL: scipy bounded scalar search on log T (tight)."""
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(
        lambda u: nll(logits, labels, np.exp(u)),
        bounds=(np.log(bounds[0]), np.log(bounds[1])),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return float(np.exp(res.x))


def ts_nll_dense_search(logits, labels, lo=0.2, hi=20.0, points=401, rounds=3):
    """Dense 1-D search of the NLL over log T: a grid, then finer grids.

    Each round evaluates ``points`` values over +- two spacings of the
    previous grid around its best point; the NLL is unimodal in T.
    """
    a, b = np.log(lo), np.log(hi)
    best = None
    for _ in range(rounds):
        grid = np.linspace(a, b, points)
        values = [nll(logits, labels, np.exp(u)) for u in grid]
        i = int(np.argmin(values))
        best = grid[i]
        step = grid[1] - grid[0]
        a, b = best - 2 * step, best + 2 * step
    return float(np.exp(best))


def top_label_ece(probs, labels, num_bins=15, p=1, right_closed=False):
    """Equal-width top-label ECE, float64.

    ``right_closed=False``: bins [lo, hi), 1.0 in the last bin.
    ``right_closed=True``: bins (lo, hi] (the focal-loss code's ECELoss),
    a confidence of exactly 0 in no bin.
    """
    probs = np.asarray(probs, np.float64)
    y = np.asarray(labels)
    conf = probs.max(1)
    correct = (probs[np.arange(len(y)), y] == conf).astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    total = 0.0
    for b in range(num_bins):
        lo, hi = edges[b], edges[b + 1]
        if right_closed:
            sel = (conf > lo) & (conf <= hi)
        else:
            sel = (conf >= lo) & ((conf < hi) if b < num_bins - 1 else (conf <= hi))
        if sel.any():
            gap = abs(correct[sel].mean() - conf[sel].mean())
            total += sel.mean() * gap**p
    return float(total ** (1.0 / p))


def softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def ets_original_nll(logits, labels, temperature, weights):
    """NLL of w1 softmax(z/T) + w2 softmax(z) + w3 / K."""
    z = np.asarray(logits, np.float64)
    k = z.shape[1]
    w = np.asarray(weights, np.float64)
    mix = w[0] * softmax(z / temperature) + w[1] * softmax(z) + w[2] / k
    y = np.asarray(labels)
    return float(-np.mean(np.log(mix[np.arange(len(y)), y])))


def ets_weights_slsqp(logits, labels, temperature):
    """Simplex weights minimising the ETS mixture NLL (scipy SLSQP)."""
    from scipy.optimize import minimize

    res = minimize(
        lambda w: ets_original_nll(logits, labels, temperature, w),
        x0=np.array([1 / 3, 1 / 3, 1 / 3]),
        method="SLSQP",
        bounds=[(0.0, 1.0)] * 3,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}],
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x


def dirichlet_odir_objective(w, b, logits, labels, lam, mu):
    """Mean NLL of softmax(W log softmax(z) + b) + ODIR penalty, float64."""
    z = np.asarray(logits, np.float64)
    log_q = z - logsumexp(z, axis=1, keepdims=True)
    out = log_q @ np.asarray(w, np.float64).T + np.asarray(b, np.float64)
    y = np.asarray(labels)
    nll_ = np.mean(logsumexp(out, axis=1) - out[np.arange(len(y)), y])
    k = w.shape[0]
    off = np.sum(w**2) - np.sum(np.diag(w) ** 2)
    return float(nll_ + lam * off / (k * (k - 1)) + mu * np.sum(b**2) / k)


def dirichlet_odir_fit_scipy(logits, labels, lam, mu):
    """ODIR Dirichlet calibration fitted by scipy L-BFGS-B (numerical grads)."""
    from scipy.optimize import minimize

    k = np.asarray(logits).shape[1]

    def f(theta):
        return dirichlet_odir_objective(
            theta[: k * k].reshape(k, k), theta[k * k :], logits, labels, lam, mu
        )

    theta0 = np.concatenate([np.eye(k).ravel(), np.zeros(k)])
    res = minimize(
        f,
        theta0,
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 5000},
    )
    return res.x[: k * k].reshape(k, k), res.x[k * k :], float(res.fun)


def class_mean_nll(logits, labels, num_classes):
    """Per-class mean NLL of softmax(logits) (NaN for absent classes)."""
    z = np.asarray(logits, np.float64)
    y = np.asarray(labels)
    per = logsumexp(z, axis=1) - z[np.arange(len(y)), y]
    return np.array(
        [per[y == c].mean() if np.any(y == c) else np.nan for c in range(num_classes)]
    )


def nd_normalize(x):
    """Eq. (4) of Jung et al. 2023 with the population standard deviation."""
    x = np.asarray(x, np.float64)
    return (x - x.mean()) / np.sqrt(np.mean(x**2) - x.mean() ** 2)


def scaling_weights(norm, alpha, beta):
    """Eq. (5) of Jung et al. 2023."""
    return beta / (1.0 + np.exp(-np.asarray(norm, np.float64) / alpha)) - beta / 2.0


def eq6_objective(alpha, beta, l0, l1):
    """Eq. (6) of Jung et al. 2023, as printed."""
    l0 = np.asarray(l0, np.float64)
    l1 = np.asarray(l1, np.float64)
    sigma = scaling_weights(nd_normalize(l1), alpha, beta)
    return float(np.sqrt(np.sum((l0 - sigma * (l1 - l0) - l1.mean()) ** 2)))
