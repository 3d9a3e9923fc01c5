"""Float64 NumPy references of the per-example losses, written from the papers.

Explicit per-row loops and an explicit softmax, deliberately unlike the
vectorised log-space JAX code they check. No JAX import. Every ``ref_<loss>``
takes an unmasked batch ``(logits [B, K], labels [B], **hyperparameters)`` and
returns float64 ``[B]`` (``ref_acls_logit_grad``: ``[B, K]``).
"""

from __future__ import annotations

import math

import numpy as np


def _softmax(z):
    z = [float(v) for v in z]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    s = sum(e)
    return [v / s for v in e]


def _log_softmax(z):
    z = [float(v) for v in z]
    top = max(z)
    lse = top + math.log(sum(math.exp(v - top) for v in z))
    return [v - lse for v in z]


def _log_sigmoid(x):
    # log(1 / (1 + exp(-x))), written to stay finite for large |x|.
    if x >= 0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


def _rows(logits, labels):
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    for i in range(logits.shape[0]):
        yield logits[i], int(labels[i])


def _out(values):
    return np.asarray(values, np.float64)


# --- Primary losses ----------------------------------------------------------


def ref_cross_entropy(logits, labels):
    """-log p_y (ACLS, Eq. (1) with one-hot q)."""
    return _out([-_log_softmax(z)[y] for z, y in _rows(logits, labels)])


def ref_label_smoothing(logits, labels, *, epsilon=0.1, off_target="uniform"):
    """-sum_k q_k log p_k with the smoothed target of ACLS Eq. (4) ('uniform')."""
    out = []
    for z, y in _rows(logits, labels):
        k = len(z)
        logp = _log_softmax(z)
        if off_target == "uniform":
            q = [epsilon / k] * k
            q[y] += 1.0 - epsilon
        else:
            q = [epsilon / (k - 1)] * k
            q[y] = 1.0 - epsilon
        out.append(-sum(qk * lk for qk, lk in zip(q, logp)))
    return _out(out)


def ref_brier(logits, labels):
    """sum_k (p_k - onehot_k)^2, no division by K."""
    out = []
    for z, y in _rows(logits, labels):
        p = _softmax(z)
        out.append(sum((p[k] - (1.0 if k == y else 0.0)) ** 2 for k in range(len(p))))
    return _out(out)


# --- Focal family ------------------------------------------------------------


def _one_minus_p_true(z, y):
    """1 - p_y as the sum of the other probabilities (no cancellation)."""
    p = _softmax(z)
    return sum(p[k] for k in range(len(p)) if k != y)


def ref_focal(logits, labels, *, gamma=3.0):
    """-(1 - p_y)^gamma log p_y (Zhou et al. 2025, Eq. (2))."""
    out = []
    for z, y in _rows(logits, labels):
        out.append(-(_one_minus_p_true(z, y) ** gamma) * _log_softmax(z)[y])
    return _out(out)


def ref_focal_adaptive(
    logits, labels, *, threshold=0.2, gamma_below=5.0, gamma_above=3.0
):
    """FLSD-53: gamma 5 if p_y in [0, 0.2), else 3 (Mukhoti et al. 2020)."""
    out = []
    for z, y in _rows(logits, labels):
        p_y = _softmax(z)[y]
        gamma = gamma_below if p_y < threshold else gamma_above
        out.append(-(_one_minus_p_true(z, y) ** gamma) * _log_softmax(z)[y])
    return _out(out)


def ref_inverse_focal(logits, labels, *, gamma=2.0):
    """-(1 + p_y)^gamma log p_y (Zhou et al. 2025, Eq. (3))."""
    out = []
    for z, y in _rows(logits, labels):
        p_y = _softmax(z)[y]
        out.append(-((1.0 + p_y) ** gamma) * _log_softmax(z)[y])
    return _out(out)


def ref_dual_focal(logits, labels, *, gamma=5.0, variant="paper"):
    """Eq. (24) of Zhou et al. 2025 ('paper'), Eqs. (25)-(26)
    ('reweighted_risk_description': misclassified = first arg-max != label)."""
    out = []
    for z, y in _rows(logits, labels):
        p = _softmax(z)
        p_j = max(p[k] for k in range(len(p)) if k != y)
        base = _one_minus_p_true(z, y) + p_j
        if variant == "reweighted_risk_description" and _argmax(z) != y:
            base = _one_minus_p_true(z, y)
        out.append(-(base**gamma) * _log_softmax(z)[y])
    return _out(out)


# --- Margin and pairwise regularizers ----------------------------------------


def ref_mbls(logits, labels, *, margin=10.0, alpha=0.1):
    """alpha * sum_k max(0, max_j z_j - z_k - m) (ACLS supp. Eq. (14))."""
    out = []
    for z, _ in _rows(logits, labels):
        top = max(z)
        out.append(alpha * sum(max(0.0, top - zk - margin) for zk in z))
    return _out(out)


def _argmax(z):
    best = 0
    for k in range(1, len(z)):
        if z[k] > z[best]:
            best = k
    return best


def ref_acls(logits, labels, *, margin=10.0, lambda_1=0.1, lambda_2=0.01):
    """ACLS Eq. (13), summed over the classes j."""
    out = []
    for z, _ in _rows(logits, labels):
        pred = _argmax(z)
        low = min(z)
        total = 0.0
        for j in range(len(z)):
            if j == pred:
                total += lambda_1 * max(0.0, z[j] - low - margin) ** 2
            else:
                total += lambda_2 * max(0.0, z[pred] - z[j] - margin) ** 2
        out.append(total)
    return _out(out)


def ref_acls_logit_grad(logits, labels, *, margin=10.0, lambda_1=0.1, lambda_2=0.01):
    """ACLS Eq. (12): the paper's logit gradient, [B, K]."""
    logits = np.asarray(logits, np.float64)
    out = np.zeros_like(logits)
    for i, (z, _) in enumerate(_rows(logits, labels)):
        pred = _argmax(z)
        low = min(z)
        for j in range(len(z)):
            if j == pred:
                out[i, j] = lambda_1 * max(0.0, z[j] - low - margin)
            else:
                out[i, j] = -lambda_2 * max(0.0, z[pred] - z[j] - margin)
    return out


def ref_cpc(logits, labels, *, lambda_1=1.0, lambda_2=1.0):
    """ACLS supp. Eqs. (2)-(4) with p_a / (p_a + p_b) from the softmax."""
    out = []
    for z, y in _rows(logits, labels):
        p = _softmax(z)
        k = len(p)
        one_v_one = 0.0
        for j in range(k):
            if j != y:
                one_v_one -= math.log(p[y] / (p[y] + p[j]))
        exclusion = 0.0
        for a in range(k):
            for b in range(k):
                if a == y or b == y or a == b:
                    continue
                # log(p_a/(p_a+p_b)) via log-sigmoid: the ratio underflows for
                # large logit gaps even in float64.
                exclusion -= _log_sigmoid(z[a] - z[b]) + _log_sigmoid(z[b] - z[a])
        out.append(lambda_1 * one_v_one + lambda_2 * exclusion)
    return _out(out)
