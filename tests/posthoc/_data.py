"""Synthetic logit sets for the post-hoc tests (NumPy, seeded)."""

from __future__ import annotations

import numpy as np


def overconfident(n, k, seed, *, scale=3.0, spread=1.5):
    """Labels drawn from softmax(g); returns ``(scale * g, labels)``.

    ``g ~ N(0, spread^2)`` are calibrated logits (labels are sampled from
    their softmax with the Gumbel-max trick), so ``scale * g`` is
    over-confident with a population-optimal temperature of ``scale``.
    """
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, k), dtype=np.float32) * np.float32(spread)
    u = rng.random((n, k), dtype=np.float32)
    gumbel = -np.log(-np.log(np.clip(u, 1e-30, 1.0 - 1e-7)))
    labels = np.argmax(g + gumbel, axis=1).astype(np.int32)
    return (np.float32(scale) * g).astype(np.float32), labels


def long_tailed(seed, *, k=10, n0=1000, rho=0.01, scale=3.0, balanced=None):
    """Long-tailed logits in the spirit of App. C of Jung et al. (2023).

    Class ``i`` has ``floor(n0 * rho ** (i / (k - 1)))`` samples (Eq. (16));
    tail classes get a weaker true-class signal and the logits carry a bias
    towards head classes (a classifier trained on the long-tailed set), then
    everything is multiplied by ``scale`` (over-confidence). ``balanced=m``
    draws ``m`` samples per class instead (a balanced test set, as the
    CIFAR-LT test sets of the paper), with the same classifier.
    """
    rng = np.random.default_rng(seed)
    prior = np.floor(n0 * rho ** (np.arange(k) / (k - 1))).astype(int)
    counts = prior if balanced is None else np.full(k, int(balanced))
    labels = np.repeat(np.arange(k), counts).astype(np.int32)
    g = rng.normal(size=(labels.size, k))
    g[np.arange(labels.size), labels] += np.linspace(2.5, 0.5, k)[labels]
    g += 0.5 * np.log(prior / n0)[None, :]
    return (scale * g).astype(np.float32), labels
