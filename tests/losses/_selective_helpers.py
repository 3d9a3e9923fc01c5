"""Batches, cross-entropies and confidence scores shared by the selective-loss
tests (test_confidence.py, test_aurc.py, test_au_pxtau.py)."""

from __future__ import annotations

import numpy as np
from _reference_batch import ref_csf

CSFS = ["msp", "neg_entropy", "softmax_margin"]


def batch(seed, b=24, k=5, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k))
    labels = rng.integers(0, k, size=b)
    labels = np.where(rng.random(b) < 0.5, logits.argmax(1), labels)
    return logits, labels.astype(np.int32)


def ce(logits, labels):
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return -logp[np.arange(len(labels)), labels]


def scores(logits, csf):
    z = logits - logits.max(1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return np.array([ref_csf(row, csf) for row in probs])
