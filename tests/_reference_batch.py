"""Float64 NumPy references of the batch-level losses, written from the papers.

Plain loops over samples, bins and classes, deliberately unlike the vectorised
JAX code they check. No JAX import. Every function takes an unmasked batch
``(logits [B, K], labels [B], **hyperparameters)`` and returns a Python float.
"""

from __future__ import annotations

import math

import numpy as np


def _softmax_row(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def _rows(logits):
    return [_softmax_row(z) for z in np.asarray(logits, np.float64)]


def _entropy(p):
    return -sum(float(q) * math.log(q) for q in p if q > 0.0)


def _top(p):
    """(index of the first maximum, maximum) of one probability row."""
    best = 0
    for k in range(1, len(p)):
        if p[k] > p[best]:
            best = k
    return best, float(p[best])


# --- SB-ECE (Karandikar et al. 2021, Eqs. 8-12) -----------------------------


def _membership(c, num_bins, temperature):
    scores = [-((c - (j + 0.5) / num_bins) ** 2) / temperature for j in range(num_bins)]
    top = max(scores)
    w = [math.exp(s - top) for s in scores]
    total = sum(w)
    return [x / total for x in w]


def ref_sb_ece(
    logits, labels, *, num_bins=15, temperature=0.01, p=2.0, kind="lb"
) -> float:
    probs = _rows(logits)
    conf, acc = [], []
    for row, y in zip(probs, labels):
        k, c = _top(row)
        conf.append(c)
        acc.append(1.0 if k == int(y) else 0.0)
    n = len(conf)
    u = [_membership(c, num_bins, temperature) for c in conf]
    total = 0.0
    bin_acc = []
    sizes = []
    for j in range(num_bins):
        s = sum(u[i][j] for i in range(n))
        sizes.append(s)
        a = sum(u[i][j] * acc[i] for i in range(n)) / s if s > 0 else 0.0
        bin_acc.append(a)
        if kind == "bin" and s > 0:
            cj = sum(u[i][j] * conf[i] for i in range(n)) / s
            total += s / n * abs(a - cj) ** p
    if kind == "lb":
        for i in range(n):
            for j in range(num_bins):
                total += u[i][j] * abs(bin_acc[j] - conf[i]) ** p / n
    return total ** (1.0 / p)


def ref_hard_ece(logits, labels, *, num_bins=15, p=2.0, kind="lb") -> float:
    """Hard equal-width ECE_bin,p (Eq. 6) / ECE_lb,p (Eq. 7), bins [j/M, (j+1)/M)."""
    probs = _rows(logits)
    members = [[] for _ in range(num_bins)]
    conf, acc = [], []
    for i, (row, y) in enumerate(zip(probs, labels)):
        k, c = _top(row)
        conf.append(c)
        acc.append(1.0 if k == int(y) else 0.0)
        members[min(int(c * num_bins), num_bins - 1)].append(i)
    n = len(conf)
    total = 0.0
    for idx in members:
        if not idx:
            continue
        a = sum(acc[i] for i in idx) / len(idx)
        cbar = sum(conf[i] for i in idx) / len(idx)
        if kind == "bin":
            total += len(idx) / n * abs(a - cbar) ** p
        else:
            total += sum(abs(a - conf[i]) ** p for i in idx) / n
    return total ** (1.0 / p)


# --- AvUC family (Karandikar et al. 2021, Eqs. 13-16, App. F) ---------------


def _avuc_ratio(n_au, n_ic, n_ac, n_iu, eps=1e-10):
    return math.log(n_au + n_ic + n_ac + n_iu + eps) - math.log(n_ac + n_iu + eps)


def ref_avuc(logits, labels, *, kappa=0.5) -> float:
    n_au = n_ic = n_ac = n_iu = 0.0
    for row, y in zip(_rows(logits), labels):
        k, c = _top(row)
        h = _entropy(row)
        uncertain = h / math.log(len(row)) > kappa
        th = math.tanh(h)
        if k == int(y):
            if uncertain:
                n_au += c * th
            else:
                n_ac += c * (1.0 - th)
        else:
            if uncertain:
                n_iu += (1.0 - c) * th
            else:
                n_ic += (1.0 - c) * (1.0 - th)
    return _avuc_ratio(n_au, n_ic, n_ac, n_iu)


def ref_s_avuc(logits, labels, *, kappa=0.5, temperature=1.0) -> float:
    n_au = n_ic = n_ac = n_iu = 0.0
    for row, y in zip(_rows(logits), labels):
        k, _ = _top(row)
        h = _entropy(row)
        hs = min(max(h / math.log(len(row)), 1e-300), 1.0 - 1e-16)
        z = math.log(hs * (1.0 - kappa) / ((1.0 - hs) * kappa)) / temperature
        t = 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0
        th = math.tanh(h)
        if k == int(y):
            n_au += t * th
            n_ac += (1.0 - t) * (1.0 - th)
        else:
            n_ic += (1.0 - t) * (1.0 - th)
            n_iu += t * th
    return _avuc_ratio(n_au, n_ic, n_ac, n_iu)


# --- MMCE (Kumar et al. 2018) and MDCA (Hebbalaguppe et al. 2022) ----------


def ref_mmce(logits, labels, *, bandwidth=0.4, weighted=False, squared=False) -> float:
    r, c = [], []
    for row, y in zip(_rows(logits), labels):
        k, conf = _top(row)
        r.append(conf)
        c.append(1.0 if k == int(y) else 0.0)
    n = len(r)

    def kern(a, b):
        return math.exp(-abs(a - b) / bandwidth)

    total = 0.0
    if not weighted:
        for i in range(n):
            for j in range(n):
                total += (c[i] - r[i]) * (c[j] - r[j]) * kern(r[i], r[j])
        total /= n * n
    else:
        good = [i for i in range(n) if c[i] == 1.0]
        bad = [i for i in range(n) if c[i] == 0.0]
        if good:
            for i in good:
                for j in good:
                    total += (1 - r[i]) * (1 - r[j]) * kern(r[i], r[j]) / len(good) ** 2
        if bad:
            for i in bad:
                for j in bad:
                    total += r[i] * r[j] * kern(r[i], r[j]) / len(bad) ** 2
        if good and bad:
            for i in good:
                for j in bad:
                    total -= (
                        2
                        * (1 - r[i])
                        * r[j]
                        * kern(r[i], r[j])
                        / (len(good) * len(bad))
                    )
    total = max(total, 0.0)
    return total if squared else math.sqrt(total)


def ref_mdca(logits, labels) -> float:
    probs = _rows(logits)
    n, k = len(probs), len(probs[0])
    total = 0.0
    for cls in range(k):
        mean_p = sum(row[cls] for row in probs) / n
        freq = sum(1 for y in labels if int(y) == cls) / n
        total += abs(mean_p - freq)
    return total / k


# --- Selective risk (Zhou et al. 2025) --------------------------------------


def ref_csf(row, csf) -> float:
    """Confidence score of one probability row (App. Table 1)."""
    if csf == "msp":
        return float(max(row))
    if csf == "neg_entropy":
        return -_entropy(row)
    ordered = sorted((float(q) for q in row), reverse=True)
    return ordered[0] - (ordered[1] if len(ordered) > 1 else 0.0)


def _ce(row, y):
    return -math.log(row[int(y)])


def ref_aurc(logits, labels, *, csf="msp") -> float:
    """Mean over coverages m/n of the selective CE risk of the m top-scored samples.

    Brute force: for every coverage level, select the samples, average their
    losses; no weights. Assumes no tied scores.
    """
    probs = _rows(logits)
    scores = [ref_csf(row, csf) for row in probs]
    losses = [_ce(row, y) for row, y in zip(probs, labels)]
    n = len(scores)
    order = sorted(range(n), key=lambda i: -scores[i])
    risks = []
    for m in range(1, n + 1):
        chosen = order[:m]
        risks.append(sum(losses[i] for i in chosen) / m)
    return sum(risks) / n


def _score_range(csf, num_classes):
    if csf == "neg_entropy":
        return -math.log(num_classes), 0.0
    return 0.0, 1.0


def ref_au_pxtau_weights(
    logits, *, num_bins=15, nu=0.1, tau=None, coverage=None, csf="msp"
) -> list[float]:
    """Eq. (16) weights with the Eq. (14)-(15) smoothed histogram CDF."""
    probs = _rows(logits)
    scores = [ref_csf(row, csf) for row in probs]
    n = len(scores)
    lo, hi = _score_range(csf, len(probs[0]))
    edges = [lo + (hi - lo) * k / num_bins for k in range(num_bins + 1)]
    centres = [(edges[k] + edges[k + 1]) / 2 for k in range(num_bins)]
    counts = [0] * num_bins
    for s in scores:
        for k in range(num_bins):
            last = k == num_bins - 1
            left_ok = s >= edges[k] or k == 0
            right_ok = s < edges[k + 1] or last
            if left_ok and right_ok:
                counts[k] += 1
                break
    if tau is None:
        coverage = 0.9 if coverage is None else coverage
        target = coverage * n
        running = 0
        for k in range(num_bins):
            if running + counts[k] >= target or k == num_bins - 1:
                frac = (target - running) / counts[k] if counts[k] else 0.0
                tau = edges[k] + min(max(frac, 0.0), 1.0) * (edges[k + 1] - edges[k])
                break
            running += counts[k]

    def survival(s):
        # 1 - G_nu(s) of Eq. (15), as sum_k h_k sigma((c_k - s) / nu) / n.
        total = 0.0
        for k in range(num_bins):
            total += counts[k] / (1.0 + math.exp((s - centres[k]) / nu))
        return total / n

    top_weight = -math.log(survival(tau))
    return [top_weight if s >= tau else -math.log(survival(s)) for s in scores]


def ref_au_pxtau(
    logits, labels, *, num_bins=15, nu=0.1, tau=None, coverage=None, csf="msp"
) -> float:
    probs = _rows(logits)
    weights = ref_au_pxtau_weights(
        logits, num_bins=num_bins, nu=nu, tau=tau, coverage=coverage, csf=csf
    )
    losses = [_ce(row, y) for row, y in zip(probs, labels)]
    return sum(w * l for w, l in zip(weights, losses)) / len(losses)
