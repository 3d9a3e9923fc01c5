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


# ---------------------------------------------------------------------------
# Histogram binning, isotonic regression, Platt and Beta calibration
# (float64, written from the papers; independent of calib_jax).
# ---------------------------------------------------------------------------


def equal_mass_thresholds(scores, num_bins):
    """The M - 1 thresholds of Gupta & Ramdas's equal-mass bins, float64.

    The n sorted scores are cut into M consecutive groups, the first
    ``n % M`` of them one score longer; the threshold between groups j - 1
    and j is the last score of group j - 1. A score v falls in bin
    ``#{j : v > t_j}``.
    """
    s = np.sort(np.asarray(scores, np.float64))
    n = s.size
    q, rem = divmod(n, num_bins)
    sizes = [q + 1 if j < rem else q for j in range(num_bins)]
    ends = np.cumsum(sizes)[:-1]  # start of groups 1..M-1
    return s[np.clip(ends - 1, 0, n - 1)]


def histogram_binning_binary(scores, targets, num_bins, binning="equal_mass"):
    """Zadrozny & Elkan (2001) histogram binning of one binary problem.

    Returns ``(thresholds [M-1], values [M])``: each bin's fraction of
    positives; an empty bin takes the nearest non-empty bin below (else
    above).
    """
    v = np.asarray(scores, np.float64)
    t = np.asarray(targets, np.float64)
    if binning == "equal_mass":
        thr = equal_mass_thresholds(v, num_bins)
    else:
        thr = np.arange(1, num_bins) / num_bins
    bins = np.sum(v[:, None] > thr[None, :], axis=1)
    values = np.full(num_bins, np.nan)
    for b in range(num_bins):
        if np.any(bins == b):
            values[b] = t[bins == b].mean()
    for b in range(num_bins):
        if np.isnan(values[b]):
            lower = [c for c in range(b) if not np.isnan(values[c])]
            upper = [c for c in range(b + 1, num_bins) if not np.isnan(values[c])]
            values[b] = values[lower[-1]] if lower else values[upper[0]]
    return thr, values


def histogram_binning_predict(thr, values, v):
    v = np.asarray(v, np.float64)
    return np.asarray(values)[np.sum(v[:, None] > np.asarray(thr)[None, :], axis=1)]


def top_label_reduction(probs_val, labels_val, probs_test, fit, predict):
    """Gupta & Ramdas (2022) top-label reduction with simplex completion.

    One binary calibrator per predicted class, fitted on (confidence, correct)
    of the validation rows predicted as that class; at test time the
    predicted class gets the calibrated confidence c' and the others share
    1 - c' in proportion to their probabilities. Classes never predicted on
    validation keep the uncalibrated confidence. If the other probabilities
    are all 0, they share 1 - c' evenly.
    """
    pv = np.asarray(probs_val, np.float64)
    pt = np.asarray(probs_test, np.float64)
    yv = np.asarray(labels_val)
    pred_v, conf_v = pv.argmax(1), pv.max(1)
    pred_t, conf_t = pt.argmax(1), pt.max(1)
    calibrated = conf_t.copy()
    for l in np.unique(pred_t):
        sel = pred_v == l
        if sel.any():
            model = fit(conf_v[sel], (yv[sel] == l).astype(float))
            rows = pred_t == l
            calibrated[rows] = predict(model, conf_t[rows])
    out = np.empty_like(pt)
    for row in range(pt.shape[0]):
        l = pred_t[row]
        c = calibrated[row]
        rest = pt[row].sum() - pt[row, l]  # 1 - confidence, without cancellation
        if rest > 0:
            out[row] = pt[row] * (1.0 - c) / rest
        else:
            out[row] = (1.0 - c) / (pt.shape[1] - 1)
        out[row, l] = c
    return out


def one_vs_rest_reduction(probs_val, labels_val, probs_test, fit, predict):
    """Zadrozny & Elkan (2002) one-vs-rest reduction, normalised rows."""
    pv = np.asarray(probs_val, np.float64)
    pt = np.asarray(probs_test, np.float64)
    yv = np.asarray(labels_val)
    q = np.empty_like(pt)
    for c in range(pv.shape[1]):
        model = fit(pv[:, c], (yv == c).astype(float))
        q[:, c] = predict(model, pt[:, c])
    total = q.sum(1, keepdims=True)
    return np.where(total > 0, q / np.where(total > 0, total, 1.0), 1.0 / q.shape[1])


def logistic_fit(features, targets, free=None, start=None):
    """Unregularised logistic regression, float64 (scipy BFGS, tight)."""
    from scipy.optimize import minimize

    x = np.asarray(features, np.float64)
    t = np.asarray(targets, np.float64)
    p = x.shape[1]
    free = np.ones(p, bool) if free is None else np.asarray(free)
    beta = np.zeros(p) if start is None else np.asarray(start, np.float64).copy()

    def unpack(theta):
        b = beta.copy()
        b[free] = theta
        return b

    def loss(theta):
        f = x @ unpack(theta)
        return np.mean(np.logaddexp(0.0, f) - t * f)

    def grad(theta):
        f = x @ unpack(theta)
        s = 0.5 * (1.0 + np.tanh(0.5 * f))
        return (x.T @ (s - t) / len(t))[free]

    res = minimize(
        loss,
        beta[free],
        jac=grad,
        method="BFGS",
        options={"gtol": 1e-12, "maxiter": 10_000},
    )
    return unpack(res.x)


def platt_fit(logits, labels, smoothing=True):
    """Platt (1999): (a, b) of sigma(a (z1 - z0) + b); Eq. (3) targets."""
    z = np.asarray(logits, np.float64)
    y = np.asarray(labels)
    d = z[:, 1] - z[:, 0]
    if smoothing:
        n_pos, n_neg = np.sum(y == 1), np.sum(y == 0)
        t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    else:
        t = (y == 1).astype(float)
    a, b = logistic_fit(np.stack([d, np.ones_like(d)], 1), t, start=[1.0, 0.0])
    return a, b


def beta_features(logits):
    """(ln s, -ln(1 - s), 1) with s = softmax(z)_1, float64."""
    z = np.asarray(logits, np.float64)
    d = z[:, 1] - z[:, 0]
    ln_s = -np.logaddexp(0.0, -d)
    ln_1ms = -np.logaddexp(0.0, d)
    return np.stack([ln_s, -ln_1ms, np.ones_like(d)], 1)


def beta_fit(logits, labels):
    """Kull et al. (2017): (a, b, c); refit without ln s if a < 0, else
    without -ln(1 - s) if b < 0."""
    x = beta_features(logits)
    y = (np.asarray(labels) == 1).astype(float)
    full = logistic_fit(x, y, start=[1.0, 1.0, 0.0])
    if full[0] < 0:
        return logistic_fit(x, y, free=[False, True, True], start=[0.0, 1.0, 0.0])
    if full[1] < 0:
        return logistic_fit(x, y, free=[True, False, True], start=[1.0, 0.0, 0.0])
    return full


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))
