"""MMCE and MDCA identities, variants and validation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import ref_mdca, ref_mmce

from calib_jax.losses._mdca import mdca
from calib_jax.losses._mmce import mmce


def _batch(seed, b=24, k=5, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k))
    labels = rng.integers(0, k, size=b)
    labels = np.where(rng.random(b) < 0.5, logits.argmax(1), labels)
    return logits, labels.astype(np.int32)


def _calibrated_batch():
    """Confidence 0.75 everywhere and exactly 3/4 of the predictions right."""
    logits = np.zeros((16, 4), np.float32)
    logits[:, 0] = math.log(9.0)
    labels = np.zeros(16, np.int32)
    labels[:4] = 2
    return logits, labels


@pytest.mark.long
def test_mmce_is_zero_on_a_perfectly_calibrated_batch():
    logits, labels = _calibrated_batch()
    assert abs(float(mmce(logits, labels, squared=True))) < 1e-7
    assert abs(float(mmce(logits, labels))) < 1e-3
    g = jax.grad(lambda x: mmce(x, labels))(jnp.asarray(logits))
    assert np.all(np.isfinite(g))


def test_mmce_root_and_square_agree():
    logits, labels = _batch(0)
    x = logits.astype(np.float32)
    for weighted in (False, True):
        root = float(mmce(x, labels, weighted=weighted))
        sq = float(mmce(x, labels, weighted=weighted, squared=True))
        assert root > 0.01
        np.testing.assert_allclose(root**2, sq, rtol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("bandwidth", [0.05, 0.4, 2.0])
def test_mmce_squared_matches_reference(weighted, bandwidth):
    logits, labels = _batch(1)
    got = mmce(
        logits.astype(np.float32),
        labels,
        bandwidth=bandwidth,
        weighted=weighted,
        squared=True,
    )
    want = ref_mmce(
        logits, labels, bandwidth=bandwidth, weighted=weighted, squared=True
    )
    np.testing.assert_allclose(got, want, rtol=2e-5)


@pytest.mark.parametrize("correct", [True, False])
def test_weighted_mmce_with_one_empty_group(correct):
    # The empty group contributes nothing; the other keeps its own term.
    logits, _ = _batch(2, b=8)
    top = logits.argmax(1)
    labels = (top if correct else (top + 1) % 5).astype(np.int32)
    z = logits - logits.max(1, keepdims=True)
    r = 1.0 / np.exp(z).sum(1)
    w = (1.0 - r) if correct else r
    kern = np.exp(-np.abs(r[:, None] - r[None, :]) / 0.4)
    want = float(w @ kern @ w) / len(r) ** 2
    got = mmce(logits.astype(np.float32), labels, weighted=True, squared=True)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Unweighted MMCE is the same when a single group is present.
    np.testing.assert_allclose(
        mmce(logits.astype(np.float32), labels, squared=True), want, rtol=1e-5
    )


def test_mmce_single_sample_by_hand():
    # N = 1: MMCE^2 = (c - r)^2 k(r, r) = (c - r)^2.
    logits = np.array([[1.0, 0.0]], np.float32)
    r = 1.0 / (1.0 + math.exp(-1.0))
    np.testing.assert_allclose(mmce(logits, np.array([0])), 1.0 - r, rtol=1e-6)
    np.testing.assert_allclose(mmce(logits, np.array([1])), r, rtol=1e-6)


@pytest.mark.parametrize("bandwidth", [0.0, -0.4])
def test_mmce_rejects_non_positive_bandwidth(bandwidth):
    logits, labels = _batch(3, b=8)
    with pytest.raises(ValueError, match="bandwidth"):
        mmce(logits, labels, bandwidth=bandwidth)


def test_mdca_is_zero_when_mean_prediction_matches_label_frequencies():
    # Uniform predictions and balanced labels.
    logits = np.zeros((12, 4), np.float32)
    labels = np.tile(np.arange(4), 3).astype(np.int32)
    assert float(mdca(logits, labels)) == 0.0
    # Confident correct predictions.
    sharp = np.eye(4, dtype=np.float32)[labels] * 1e3
    assert float(mdca(sharp, labels)) == 0.0
    g = jax.grad(lambda x: mdca(x, labels))(jnp.asarray(logits))
    assert np.all(np.isfinite(g))


def test_mdca_by_hand():
    logits = np.array([[0.0, 0.0], [math.log(3.0), 0.0]], np.float32)
    labels = np.array([1, 1], np.int32)
    # mean p = (0.625, 0.375), frequencies = (0, 1): (0.625 + 0.625) / 2.
    np.testing.assert_allclose(mdca(logits, labels), 0.625, rtol=1e-6)


def test_mdca_counts_every_class_not_only_the_top_label():
    logits, labels = _batch(4, k=7)
    np.testing.assert_allclose(
        mdca(logits.astype(np.float32), labels), ref_mdca(logits, labels), rtol=1e-5
    )
    # Moving mass between two non-top classes changes MDCA.
    moved = logits.copy()
    moved[:, :2] = moved[:, [1, 0]]
    keep = (logits.argmax(1) > 1) & (moved.argmax(1) > 1)
    assert keep.sum() > 5
    a = float(mdca(logits[keep].astype(np.float32), labels[keep]))
    b = float(mdca(moved[keep].astype(np.float32), labels[keep]))
    assert abs(a - b) > 1e-3
