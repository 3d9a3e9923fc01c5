"""Synthetic classification logits for the conformal tests."""

from __future__ import annotations

import numpy as np


def synthetic(n: int, k: int, seed: int, *, signal=(3.0, 6.0), sigma: float = 1.0):
    """Logits with a per-row signal on the true class over Gaussian noise.

    Labels are uniform on ``[0, K)``; the logit of the true class gets a
    signal drawn uniformly from ``signal`` on top of N(0, sigma^2) noise on
    every class. With K = 100 the model ranks the label high but spreads
    noisy mass over a long tail (the ImageNet-like setting RAPS targets).
    Float32 logits and int32 labels; continuous, so scores have no ties.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = sigma * rng.standard_normal((n, k))
    logits[np.arange(n), labels] += rng.uniform(*signal, n)
    return logits.astype(np.float32), labels.astype(np.int32)
