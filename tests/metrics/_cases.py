"""Input cases shared by the metric tests (float32 arrays, NumPy)."""

from __future__ import annotations

import numpy as np

EDGES_5 = np.float32([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def softmax_case(n=240, k=10, seed=0, scale=2.0, boost=2.0):
    """Random softmax probabilities with labels that are often the argmax."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    z = rng.normal(scale=scale, size=(n, k))
    z[np.arange(n), labels] += boost
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p.astype(np.float32), labels.astype(np.int32)


def with_max_ties(probs, labels):
    """Rows 0-3 uniform, rows 4-7 tie classes 0 and 1 at the max (labels 0/1)."""
    probs, labels = probs.copy(), labels.copy()
    k = probs.shape[1]
    probs[:4] = np.float32(1.0 / k)
    if k > 2:
        tie = np.full(k, 0.2 / (k - 2), np.float32)
        tie[:2] = 0.4
        probs[4:8] = tie
    labels[4:8] = [0, 1, 1, 0]
    return probs, labels


def binary_case(confidences, correct):
    """K=2 rows [c, 1 - c]; the label is class 0 when ``correct`` else 1."""
    c = np.asarray(confidences, np.float32)
    probs = np.stack([c, np.float32(1.0) - c], axis=1)
    labels = np.where(np.asarray(correct), 0, 1).astype(np.int32)
    return probs, labels


def edge_case():
    """Top-label confidences exactly on the float32 edges of 5 and 10 bins."""
    conf = np.float32([0.5, 0.6, 0.6, 0.7, 0.8, 0.8, 0.9, 1.0, 1.0, 0.5])
    correct = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 0], bool)
    return binary_case(conf, correct)


def classwise_edge_case():
    """Rows whose entries sit on the edges 0, 0.2, ..., 1.0 (K = 5)."""
    rows = np.float32(
        [
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.4, 0.6, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.8, 0.2, 0.0],
            [0.6, 0.0, 0.0, 0.0, 0.4],
            [0.0, 0.4, 0.4, 0.2, 0.0],
        ]
    )
    labels = np.int32([0, 3, 1, 2, 4, 1])
    return rows, labels


def tie_case(n=60, seed=1):
    """Many identical confidences (few distinct values) for equal-mass ties."""
    rng = np.random.default_rng(seed)
    conf = rng.choice(np.float32([0.55, 0.7, 0.7, 0.9, 0.95]), size=n)
    correct = rng.random(n) < conf
    return binary_case(conf, correct)


PAD = 256


def padded(probs, labels, size=PAD):
    """Pads a case to ``size`` rows (uniform rows, label 0) plus its mask.

    Padding every case to one shape per K keeps the number of compilations
    small and exercises ``where`` in every value test.
    """
    n, k = probs.shape
    extra = size - n
    assert extra >= 0, (n, size)
    pad = np.full((extra, k), 1.0 / k, np.float32)
    where = np.arange(size) < n
    return (
        np.concatenate([probs, pad]),
        np.concatenate([labels, np.zeros(extra, np.int32)]),
        where,
    )


def all_cases():
    """Named (probs, labels) cases for the value tests."""
    p, y = with_max_ties(*softmax_case())
    cases = {
        "softmax_k10": (p, y),
        "softmax_k2": softmax_case(n=250, k=2, seed=3),
        "edges": edge_case(),
        "ties": tie_case(),
        "all_correct": (p, p.argmax(axis=1).astype(np.int32)),
        "all_wrong": (p, ((p.argmax(axis=1) + 1) % p.shape[1]).astype(np.int32)),
        "n1": (p[:1], y[:1]),
        "empty_bins": binary_case(np.float32([0.95, 0.97, 0.99, 0.96]), [1, 1, 0, 1]),
    }
    return cases


def wide_cases():
    """K > 32: the blocked (K = 100) and the argmax fallback (K = 37) paths."""
    return {
        "softmax_k100": with_max_ties(*softmax_case(n=200, k=100, seed=4)),
        "softmax_k37": with_max_ties(*softmax_case(n=120, k=37, seed=6)),
    }


# The value tests' default tolerance against the float64 references.
TOL = {"rtol": 1e-5, "atol": 2e-6}


def close(value, expected, **tol):
    """``value`` (a scalar array) equals ``expected`` within ``tol`` or :data:`TOL`."""
    np.testing.assert_allclose(float(value), expected, **(tol or TOL))


def padded_case(cases, name):
    """``(probs, labels, where)`` of ``cases[name]`` padded to one shape per K."""
    return padded(*cases[name])
