"""Float64 NumPy references of the metrics, written as explicit loops.

Independent of calib_jax (no JAX import): each function restates a metric's
documented rule in the most literal way, so the tests compare two
implementations of the same rule rather than one with itself.
"""

from __future__ import annotations

import bisect
import fractions
import itertools
import math

import numpy as np

PRESET_RULES = {
    # name: (edges, side, top, zero, equal_mass)
    "calib_jax": ("nearest", "left", "last", "first", "rank"),
    "torchmetrics": ("nearest", "left", "extra", "first", None),
    "netcal": ("float64", "left", "last", "first", "quantile"),
    "focal_calibration": ("nearest", "right", "last", "drop", "interp"),
    "robustness_metrics": ("floor", "left", "last", "first", "digitize"),
}


def top_label(probs, labels):
    """(confidence, correct); the prediction is the first maximal class."""
    probs = np.asarray(probs, np.float64)
    conf = np.empty(len(probs))
    correct = np.empty(len(probs), bool)
    for i, row in enumerate(probs):
        conf[i] = max(row)
        pred = next(k for k in range(len(row)) if row[k] == conf[i])
        correct[i] = pred == int(labels[i])
    return conf, correct


def edges(m, kind):
    """Bin edges E_0..E_M as float64 numbers."""
    if kind == "float64":
        return [float(x) for x in np.linspace(0.0, 1.0, m + 1)]
    return [float(np.float32(k / m)) for k in range(m + 1)]


def bin_of(c, m, preset):
    """Equal-width bin of one confidence; None when it is in no bin."""
    kind, side, top, zero, _ = PRESET_RULES[preset]
    if kind == "floor":
        return min(max(math.floor(np.float32(c) * np.float32(m)), 0), m - 1)
    e = edges(m, kind)
    if side == "left":
        slots = m + 1 if top == "extra" else m
        b = 0
        for k in range(slots):
            if c >= e[k]:
                b = k
        return b
    if c == 0.0:
        return None if zero == "drop" else 0
    for k in range(m):
        if e[k] < c <= e[k + 1]:
            return k
    raise AssertionError(c)


def num_slots(m, preset):
    return m + 1 if PRESET_RULES[preset][2] == "extra" else m


def _error_from_bins(members, conf, correct, n_total, p, min_count=1):
    """members: list of index lists per bin."""
    gaps, weights = [], []
    for idx in members:
        if len(idx) < max(min_count, 1):
            continue
        acc = sum(correct[i] for i in idx) / len(idx)
        avg = sum(conf[i] for i in idx) / len(idx)
        gaps.append(abs(acc - avg))
        weights.append(len(idx) / n_total)
    if p == "inf":
        return max(gaps, default=0.0)
    total = sum(w * g**p for w, g in zip(weights, gaps))
    return total ** (1.0 / p)


def binned_members(conf, m, preset):
    members = [[] for _ in range(num_slots(m, preset))]
    for i, c in enumerate(conf):
        b = bin_of(c, m, preset)
        if b is not None:
            members[b].append(i)
    return members


def ece(probs, labels, m=15, p=1, preset="calib_jax", where=None, binning="width"):
    """Top-label ECE (p=1), RMSCE (p=2) or MCE (p='inf')."""
    conf, correct = top_label(probs, labels)
    keep = np.ones(len(conf), bool) if where is None else np.asarray(where)
    conf, correct = conf[keep], correct[keep]
    if binning == "width":
        members = binned_members(conf, m, preset)
    else:
        members = equal_mass_members(conf, m, PRESET_RULES[preset][4])
    return _error_from_bins(members, conf, correct, len(conf), p)


def ece_from_confidences(conf, correct, m=15, p=1, preset="calib_jax"):
    """Binned error of given confidences and 0/1 outcomes."""
    conf = [float(c) for c in conf]
    members = binned_members(conf, m, preset)
    return _error_from_bins(members, conf, [float(a) for a in correct], len(conf), p)


def equal_mass_members(conf, m, rule):
    """Index lists of the equal-mass bins of one confidence vector."""
    n = len(conf)
    order = sorted(range(n), key=lambda i: (conf[i], i))
    s = [conf[i] for i in order]
    members = [[] for _ in range(m + (1 if rule == "digitize" else 0))]
    if rule == "digitize":
        # robustness_metrics GeneralCalibrationError, binning_scheme='adaptive':
        # np.round of np.linspace(0, n, m, endpoint=False) indexes the sorted
        # values; the upper edges are those values (first dropped) and 1.0;
        # np.digitize puts c in bin #(edges <= c), so 1.0 gets bin m.
        idx = np.round(np.linspace(0, n, m, endpoint=False)).astype(int)
        idx = np.minimum(idx, n - 1)
        upper = np.concatenate([np.asarray(s)[idx][1:], [1.0]])
        for i, b in enumerate(np.digitize(np.asarray(conf, np.float64), upper)):
            members[int(b)].append(i)
    elif rule == "rank":
        group = np.empty(n, int)
        for g, chunk in enumerate(np.array_split(np.arange(n), m)):
            group[chunk] = g
        for pos, i in enumerate(order):
            first = s.index(s[pos])  # first occurrence of this value
            members[group[first]].append(i)
    elif rule == "interp":
        e = np.interp(np.linspace(0, n, m + 1), np.arange(n), np.asarray(s))
        e = [float(np.float32(x)) for x in e]
        for i in range(n):
            for k in range(m):
                if e[k] < conf[i] <= e[k + 1]:
                    members[k].append(i)
    elif rule == "quantile":
        e = list(np.quantile(np.asarray(s), np.linspace(0.0, 1.0, m + 1)))
        e[0], e[-1] = 0.0, 1.0
        for i in range(n):
            for k in range(m):
                last = k == m - 1
                if e[k] <= conf[i] < e[k + 1] or (last and conf[i] == e[k + 1]):
                    members[k].append(i)
                    break
    return members


def classwise_ece(probs, labels, m=15, p=1, preset="calib_jax", root="after_mean"):
    """Def. A.1 class-wise ECE (and its l2 versions)."""
    probs = np.asarray(probs, np.float64)
    n, k = probs.shape
    per_class = []
    for c in range(k):
        conf = probs[:, c]
        outcome = np.asarray(labels) == c
        members = binned_members(conf, m, preset)
        err = _error_from_bins(members, conf, outcome, n, p)
        per_class.append(err**p if (p == 2 and root == "after_mean") else err)
    if p == 2 and root == "after_mean":
        return math.sqrt(sum(per_class) / k)
    return sum(per_class) / k


def _kumar_bins(values, m):
    """Equal-mass bins as in Kumar et al.'s library: array_split + midpoints."""
    s = sorted(values)
    m = min(m, len(s))
    parts = np.array_split(np.asarray(s), m)
    bounds = [(parts[i][-1] + parts[i + 1][0]) / 2.0 for i in range(m - 1)] + [1.0]
    bounds = sorted(set(bounds))
    members = [[] for _ in bounds]
    for i, v in enumerate(values):
        members[bisect.bisect_left(bounds, v)].append(i)
    return members


def _debiased_square(members, conf, outcome, n):
    total = 0.0
    for idx in members:
        if len(idx) < 2:
            continue
        acc = sum(outcome[i] for i in idx) / len(idx)
        avg = sum(conf[i] for i in idx) / len(idx)
        total += len(idx) / n * ((avg - acc) ** 2 - acc * (1 - acc) / (len(idx) - 1))
    return total


def marginal_ece(probs, labels, m=15, debias=False):
    """Kumar et al.'s marginal l2 calibration error (equal-mass bins)."""
    probs = np.asarray(probs, np.float64)
    n, k = probs.shape
    squares = []
    for c in range(k):
        conf = list(probs[:, c])
        outcome = [float(y == c) for y in labels]
        members = _kumar_bins(conf, m)
        if debias:
            squares.append(max(_debiased_square(members, conf, outcome, n), 0.0))
        else:
            squares.append(_error_from_bins(members, conf, outcome, n, 2) ** 2)
    return math.sqrt(sum(squares) / k)


def debiased_ece(probs, labels, m=15):
    conf, correct = top_label(probs, labels)
    members = _kumar_bins(list(conf), m)
    return math.sqrt(max(_debiased_square(members, conf, correct, len(conf)), 0.0))


def ks_error(probs, labels):
    conf, correct = top_label(probs, labels)
    n = len(conf)
    best = 0.0
    for sigma in sorted(set(conf)):
        gap = sum(correct[i] - conf[i] for i in range(n) if conf[i] <= sigma)
        best = max(best, abs(gap) / n)
    return best


def sweep_ece(probs, labels, p=1):
    conf, correct = top_label(probs, labels)
    n = len(conf)
    chosen = 1
    for b in range(2, n + 1):
        members = [idx for idx in equal_mass_members(conf, b, "rank") if idx]
        accs = [sum(correct[i] for i in idx) / len(idx) for idx in members]
        if any(accs[j + 1] < accs[j] for j in range(len(accs) - 1)):
            break
        chosen = b
    members = equal_mass_members(conf, chosen, "rank")
    return _error_from_bins(members, conf, correct, n, p)


def brier(probs, labels):
    total = 0.0
    for row, y in zip(np.asarray(probs, np.float64), labels):
        total += sum((row[k] - (1.0 if k == y else 0.0)) ** 2 for k in range(len(row)))
    return total / len(labels)


def nll(probs, labels):
    tiny = float(np.finfo(np.float32).tiny)
    probs = np.asarray(probs, np.float64)
    return -sum(math.log(max(probs[i, y], tiny)) for i, y in enumerate(labels)) / len(
        labels
    )


def accuracy(probs, labels):
    return float(np.mean(top_label(probs, labels)[1]))


def _aurc_of_errors(conf, err):
    """Mean selective risk, ties resolved by expectation over their orders."""
    n = len(conf)
    order = sorted(range(n), key=lambda i: -conf[i])
    values = [conf[i] for i in order]
    errors = [err[i] for i in order]
    total = 0.0
    for k in range(1, n + 1):
        v = values[k - 1]
        start = values.index(v)
        end = n - values[::-1].index(v)
        before = sum(errors[:start])
        group_rate = sum(errors[start:end]) / (end - start)
        total += (before + (k - start) * group_rate) / k
    return total / n


def aurc(probs, labels):
    conf, correct = top_label(probs, labels)
    return _aurc_of_errors(list(conf), [float(not c) for c in correct])


def eaurc(probs, labels, optimum="exact"):
    conf, correct = top_label(probs, labels)
    err = [float(not c) for c in correct]
    value = _aurc_of_errors(list(conf), err)
    n, m = len(err), int(sum(err))
    if optimum == "exact":
        # Distinct scores that rank every correct prediction first.
        best = _aurc_of_errors(list(range(n, 0, -1)), [0.0] * (n - m) + [1.0] * m)
    else:
        r = m / n
        best = r + ((1 - r) * math.log(1 - r) if r < 1 else 0.0)
    return value - best


def ood_auroc(s_in, s_out):
    total = 0.0
    for a in s_in:
        for b in s_out:
            total += 1.0 if a > b else (0.5 if a == b else 0.0)
    return total / (len(s_in) * len(s_out))


def ood_aupr(s_in, s_out, positive="in"):
    """Average precision over the distinct thresholds, from its definition."""
    pos = [float(v) for v in (s_in if positive == "in" else s_out)]
    neg = [float(v) for v in (s_out if positive == "in" else s_in)]
    sign = 1.0 if positive == "in" else -1.0
    area, recall_before = 0.0, 0.0
    for t in sorted({sign * v for v in pos + neg}, reverse=True):
        tp = sum(1 for v in pos if sign * v >= t)
        fp = sum(1 for v in neg if sign * v >= t)
        recall = tp / len(pos)
        area += (recall - recall_before) * (tp / (tp + fp))
        recall_before = recall
    return area


def fpr_at_tpr(s_in, s_out, tpr=0.95):
    k = math.ceil(fractions.Fraction(str(tpr)) * len(s_in))
    threshold = sorted(s_in, reverse=True)[k - 1]
    return sum(1 for b in s_out if b >= threshold) / len(s_out)


# ---------------------------------------------------------------------------
# Smooth ECE, AUGRC, risk at coverage / coverage at risk, bootstrap intervals.
# Written from the definitions in the papers (no grid, no FFT, no sort keys).
# ---------------------------------------------------------------------------


def smooth_predictions(probs, labels, target="top_label"):
    """(f, y) float64: predicted probability and 0/1 outcome."""
    if target == "top_label":
        conf, correct = top_label(probs, labels)
        return conf, correct.astype(np.float64)
    probs = np.asarray(probs, np.float64)
    return probs[:, 1].copy(), (np.asarray(labels) == 1).astype(np.float64)


def reflected_gaussian(t, u, sigma):
    """K^R_sigma(t, u) on [0, 1]: the Gaussian summed over its images under
    reflection at 0 and 1 (x -> -x and x -> 2 - x, i.e. period 2)."""
    images = math.ceil(4.0 * sigma) + 1
    total = np.zeros(np.broadcast_shapes(np.shape(t), np.shape(u)))
    for m in range(-images, images + 1):
        for x in (t - u - 2.0 * m, t + u - 2.0 * m):
            total += np.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    return total


def smooth_ece_at(f, y, sigma, points=4001):
    """smECE_sigma = integral over [0, 1] of |(1/N) sum_i K(t, f_i)(y_i - f_i)|."""
    t = np.linspace(0.0, 1.0, points)
    s = reflected_gaussian(t[:, None], f[None, :], sigma) @ (y - f) / len(f)
    a = np.abs(s)
    return float(np.sum((a[1:] + a[:-1]) / 2.0) * (t[1] - t[0]))


def smooth_ece_fixed_point(f, y, lo=1e-3, hi=1.0, points=4001):
    """sigma* with smECE_sigma* = sigma*, clamped to [lo, hi] (Brent's method)."""
    from scipy.optimize import brentq

    def gap(sigma):
        return smooth_ece_at(f, y, sigma, points) - sigma

    if gap(lo) <= 0.0:
        return lo
    if gap(hi) >= 0.0:
        return hi
    return brentq(gap, lo, hi, xtol=1e-12, rtol=1e-12)


def smooth_ece(probs, labels, sigma=None, target="top_label", points=4001):
    f, y = smooth_predictions(probs, labels, target)
    if sigma is None:
        sigma = smooth_ece_fixed_point(f, y, points=points)
    return smooth_ece_at(f, y, sigma, points), sigma


def _ranked_errors(probs, labels):
    """(conf, err) sorted by decreasing confidence."""
    conf, correct = top_label(probs, labels)
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    return [float(conf[i]) for i in order], [int(not correct[i]) for i in order]


def augrc(probs, labels):
    """Trapezoid area under (coverage, generalized risk) at the distinct
    thresholds, from (0, 0): generalized risk = P(accepted and wrong)."""
    conf, err = _ranked_errors(probs, labels)
    n = len(conf)
    points = [(0.0, 0.0)]
    for tau in sorted(set(conf), reverse=True):
        accepted = [e for c, e in zip(conf, err) if c >= tau]
        points.append((len(accepted) / n, sum(accepted) / n))
    return sum(
        (c1 - c0) * (r0 + r1) / 2.0 for (c0, r0), (c1, r1) in itertools.pairwise(points)
    )


def augrc_from_auroc(probs, labels):
    """The AUROC form: err^2 / 2 + err * acc * (1 - AUROC_f), Mann-Whitney AUROC
    of correct (positive) vs wrong by confidence, ties counting half."""
    conf, correct = top_label(probs, labels)
    good = [c for c, ok in zip(conf, correct) if ok]
    bad = [c for c, ok in zip(conf, correct) if not ok]
    n = len(conf)
    err, acc = len(bad) / n, len(good) / n
    if not good or not bad:
        return 0.5 * err * err
    auroc = ood_auroc(good, bad)
    return 0.5 * err * err + err * acc * (1.0 - auroc)


def _expected_errors(conf, err, k):
    """Expected errors among the k most confident rows, ties by expectation."""
    v = conf[k - 1]
    start = conf.index(v)
    end = len(conf) - conf[::-1].index(v)
    group = fractions.Fraction(sum(err[start:end]), end - start)
    return sum(err[:start]) + (k - start) * group


def risk_at_coverage(probs, labels, coverage):
    conf, err = _ranked_errors(probs, labels)
    n = len(conf)
    k = math.ceil(fractions.Fraction(str(coverage)) * n)
    return float(_expected_errors(conf, err, k) / k)


def coverage_at_risk(probs, labels, risk):
    conf, err = _ranked_errors(probs, labels)
    n = len(conf)
    target = fractions.Fraction(str(risk))
    best = 0
    for k in range(1, n + 1):
        if _expected_errors(conf, err, k) / k <= target:
            best = k
    return best / n


def percentile_interval(values, confidence=0.95):
    """NumPy percentile interval (linear interpolation) of bootstrap values."""
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(np.asarray(values, np.float64), [alpha, 1.0 - alpha])
    return float(lo), float(hi)
