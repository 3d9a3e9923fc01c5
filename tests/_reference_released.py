"""Float64 NumPy references of the ``variant='released_code'`` losses.

Each follows the arithmetic of the authors' repository named in the loss's
docstring, re-derived step by step in plain loops (no JAX). Every reference
takes ``at=`` (default: the logits themselves): the discrete choices the
released code makes (arg-max indices, masks, clamps that are active, the sort
order of a quantile, which side of tau a sample is on) are taken at ``at``,
the values at ``logits``. With ``at`` fixed the reference is smooth in the
logits, so :func:`fd_grad` (central differences in float64) gives the
gradient autodiff of the released code gives at ``at``, kinks included.
"""

from __future__ import annotations

import math

import numpy as np


def _softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def _first_argmax(v):
    best = 0
    for k in range(1, len(v)):
        if v[k] > v[best]:
            best = k
    return best


def _clamp(x, lo, hi, x_at):
    """torch.clamp: constant where the clamp is active at ``x_at``."""
    if x_at < lo:
        return lo
    if x_at > hi:
        return hi
    return x


def _pick(out, row):
    """The output a perturbation of ``row`` can move: that row's entry of a
    per-example loss (the other rows' large values would swamp the difference
    in rounding), or the batch-level scalar."""
    out = np.asarray(out, np.float64)
    return float(out[row]) if out.ndim == 1 else float(out)


def fd_grad(fn, logits, labels, h=1e-6, **kw):
    """Central differences in float64 of ``sum(fn(v, labels, at=logits))``."""
    x = np.asarray(logits, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        up = _pick(fn(x + e, labels, at=x, **kw), idx[0])
        dn = _pick(fn(x - e, labels, at=x, **kw), idx[0])
        g[idx] = (up - dn) / (2 * h)
    return g


# --- Dual focal: Linwei94/ICML2023-DualFocalLoss, Losses/dual_focal_loss.py --


def ref_dual_focal_released(logits, labels, *, gamma=5.0, at=None, **unused):
    logits = np.asarray(logits, np.float64)
    at = logits if at is None else np.asarray(at, np.float64)
    out = []
    for z, za, y in zip(logits, at, labels):
        y = int(y)
        p, pa = _softmax(z), _softmax(za)
        # Largest probability strictly below p_y (index chosen at ``at``).
        best = None
        for j in range(len(z)):
            if pa[j] < pa[y] and (best is None or pa[j] > pa[best]):
                best = j
        p_j = p[best] if best is not None else 0.0
        one_minus = sum(p[k] for k in range(len(z)) if k != y)
        log_py = z[y] - z.max() - math.log(np.exp(z - z.max()).sum())
        out.append(-((one_minus + p_j) ** gamma) * log_py)
    return np.array(out)


# --- ACLS: cvlab-yonsei/ACLS, calibrate/losses/acls.py (get_reg) ------------


def ref_acls_released(
    logits, labels, *, margin=10.0, lambda_1=0.1, lambda_2=0.01, at=None, **unused
):
    logits = np.asarray(logits, np.float64)
    at = logits if at is None else np.asarray(at, np.float64)
    out = []
    for z, za in zip(logits, at):
        k = len(z)
        i = _first_argmax(za)
        top_at = za[i]
        ties = [j for j in range(k) if za[j] == top_at]
        top = z[i]  # the max carries its gradient to one index
        top_const = top_at  # detached in the negative term
        pos = len(ties) * max(0.0, top - margin) ** 2
        neg = sum(
            max(0.0, top_const - z[j] - margin) ** 2 for j in range(k) if j not in ties
        )
        out.append(lambda_1 * pos + lambda_2 * neg / (k - 1))
    return np.array(out)


# --- SB-ECE (lb): google/uncertainty-baselines,
#     experimental/caltrain/secondary_losses.py -----------------------------


def _conf(p, pa):
    """tf.reduce_max: the derivative is shared by the maxima tied at ``pa``."""
    m = max(pa)
    tied = [k for k in range(len(pa)) if pa[k] == m]
    return sum(p[k] for k in tied) / len(tied)


def ref_sb_ece_released(
    logits, labels, *, num_bins=15, temperature=0.01, at=None, **unused
):
    logits = np.asarray(logits, np.float64)
    at = logits if at is None else np.asarray(at, np.float64)
    n, k = logits.shape
    eps = 1e-5
    lo = 1.0 / k
    edges = [lo + (1.0 - lo) * j / num_bins for j in range(num_bins + 1)]
    centres = [0.5 * edges[j + 1] + 0.5 * edges[j] for j in range(num_bins)]
    conf, acc, c = [], [], []
    for z, za, y in zip(logits, at, labels):
        p, pa = _softmax(z), _softmax(za)
        r = _conf(p, pa)
        conf.append(r)
        acc.append(1.0 if _first_argmax(za) == int(y) else 0.0)
        num = [math.exp(-((b - r) ** 2) / temperature) for b in centres]
        tot = sum(num)
        c.append([(1 - eps) * v / tot + eps / num_bins for v in num])
    sq = 0.0
    for j in range(num_bins):
        s_c = sum(c[i][j] for i in range(n))
        a_bar = sum(c[i][j] * acc[i] for i in range(n)) / s_c
        sq += sum(c[i][j] * (a_bar - conf[i]) ** 2 for i in range(n))
    return sq / n


# --- Weighted MMCE: aviralkumar2907/MMCE, 20ng_mmce.py ---------------------


def ref_mmce_released(logits, labels, *, bandwidth=0.4, at=None, **unused):
    logits = np.asarray(logits, np.float64)
    at = logits if at is None else np.asarray(at, np.float64)
    cor, inc = [], []
    for z, za, y in zip(logits, at, labels):
        p, pa = _softmax(z), _softmax(za)
        r = _conf(p, pa)
        (cor if _first_argmax(za) == int(y) else inc).append(r)
    m, n = len(cor), len(inc)
    if m == 0 or n == 0:
        return 0.0

    def kern(a, b):
        return math.exp(-abs(a - b) / bandwidth)

    cc = sum((1 - a) * (1 - b) * kern(a, b) for a in cor for b in cor) / (m * m)
    ii = sum(a * b * kern(a, b) for a in inc for b in inc) / (n * n)
    ci = sum((1 - a) * b * kern(a, b) for a in cor for b in inc) / (m * n)
    mmd = cc / (m * m + 1e-5) + ii / (n * n + 1e-5) - 2 * ci / (m * n + 1e-5)
    return math.sqrt(mmd + 1e-10)


# --- AU_Px tau: han678/CalibWeightedRisk, loss/selectAU.py, hist_rank.py ----


def _au_score(z, za, csf):
    """The released confidence score and its value at ``za`` (choices at za)."""
    k = len(z)
    eps = 1e-9

    def stage(v, va):
        out, out_at = [], []
        for x, xa in zip(v, va):
            out.append(_clamp(x, eps, 1 - eps, xa))
            out_at.append(min(max(xa, eps), 1 - eps))
        return out, out_at

    s, s_at = stage(_softmax(z), _softmax(za))
    if csf == "neg_entropy":
        g = sum(v * math.log(v) for v in s)
        g_at = sum(v * math.log(v) for v in s_at)
        lk = math.log(k)
        x, xa = (g - lk) / (0.0 - lk), (g_at - lk) / (0.0 - lk)
        return _clamp(x, 0.0, 1.0, xa), min(max(xa, 0.0), 1.0)
    q, q_at = stage(_softmax(s), _softmax(s_at))
    i = _first_argmax(q_at)
    if csf == "msp":
        return q[i], q_at[i]
    rest = [j for j in range(k) if j != i]
    j = rest[_first_argmax([q_at[r] for r in rest])]
    return q[i] - q[j], q_at[i] - q_at[j]


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def ref_au_score_released(logits, *, csf="msp"):
    logits = np.asarray(logits, np.float64)
    return np.array([_au_score(z, z, csf)[0] for z in logits])


def ref_au_hist_released(logits, num_bins, *, csf="msp"):
    """Counts of the released scores (torch.bucketize(right=True) - 1, clamped)."""
    counts = np.zeros(num_bins)
    edges = [j / num_bins for j in range(num_bins + 1)]
    for s in ref_au_score_released(logits, csf=csf):
        idx = sum(1 for e in edges if e <= s) - 1
        counts[min(max(idx, 0), num_bins - 1)] += 1
    return counts


def ref_au_pxtau_released(
    logits,
    labels,
    *,
    num_bins=15,
    nu=0.1,
    coverage=0.9,
    csf="msp",
    hist=None,
    at=None,
    **unused,
):
    logits = np.asarray(logits, np.float64)
    at = logits if at is None else np.asarray(at, np.float64)
    b = len(logits)
    pairs = [_au_score(z, za, csf) for z, za in zip(logits, at)]
    score = [v for v, _ in pairs]
    score_at = [va for _, va in pairs]
    counts = ref_au_hist_released(at, num_bins, csf=csf) if hist is None else hist
    counts = np.asarray(counts, np.float64)
    edges = [j / num_bins for j in range(num_bins + 1)]
    centres = [0.5 * (edges[j] + edges[j + 1]) for j in range(num_bins)]
    total = max(float(counts.sum()), 1e-12)

    def cdf(x):
        return (
            sum(_sigmoid((x - c) / nu) * max(h, 1e-12) for c, h in zip(centres, counts))
            / total
        )

    # torch.quantile, linear; the sort order (stable) is taken at ``at``.
    order = sorted(range(b), key=lambda i: score_at[i])
    pos = coverage * (b - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, b - 1)
    frac = pos - lo
    tau = score[order[lo]] + frac * (score[order[hi]] - score[order[lo]])
    tau_at = score_at[order[lo]] + frac * (score_at[order[hi]] - score_at[order[lo]])
    g_lo, g_hi = 1.0 / (b + 1), b / (b + 1.0)
    g_tau = _clamp(cdf(tau), g_lo, g_hi, cdf(tau_at))
    ce = [
        -(z[int(y)] - z.max() - math.log(np.exp(z - z.max()).sum()))
        for z, y in zip(logits, labels)
    ]
    total_loss = 0.0
    for i in range(b):
        if score_at[i] >= tau_at:
            alpha = -math.log(1 - g_tau)
        else:
            g = _clamp(cdf(score[i]), g_lo, g_hi, cdf(score_at[i]))
            alpha = -math.log(1 - g)
        total_loss += alpha * ce[i]
    return total_loss / b
