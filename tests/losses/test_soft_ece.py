"""SB-ECE identities: hard-binning limit, Jensen ordering, zeros, validation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import ref_hard_ece, ref_sb_ece

from calib_jax.losses._soft_ece import (
    sb_ece,
    sb_ece_from_confidences,
    soft_bin_membership,
)


def _batch(seed, b=64, k=4, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k))
    labels = rng.integers(0, k, size=b)
    labels = np.where(rng.random(b) < 0.6, logits.argmax(1), labels)
    return logits, labels.astype(np.int32)


def _away_from_edges(logits, num_bins, gap):
    """Rows whose max-probability is at least ``gap`` from every bin edge."""
    z = logits - logits.max(1, keepdims=True)
    conf = 1.0 / np.exp(z).sum(1)
    dist = np.abs(conf[:, None] - np.arange(num_bins + 1)[None, :] / num_bins)
    return dist.min(1) > gap


@pytest.mark.parametrize("kind", ["lb", "bin"])
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_tends_to_hard_binned_ece_as_temperature_vanishes(kind, p):
    logits, labels = _batch(0)
    keep = _away_from_edges(logits, 15, 2e-3)
    logits, labels = logits[keep], labels[keep]
    assert keep.sum() > 40
    hard = ref_hard_ece(logits, labels, num_bins=15, p=p, kind=kind)
    with jax.enable_x64(True):
        x = jnp.asarray(logits, jnp.float64)
        errors = [
            abs(float(sb_ece(x, labels, temperature=t, p=p, kind=kind)) - hard)
            for t in (1e-2, 1e-3, 1e-4, 1e-5)
        ]
    # Soft binning is visibly different at the default-like temperature ...
    assert errors[0] > 1e-3
    # ... and converges to the hard-binned value (same bins, same p).
    assert errors[-1] < 1e-9
    assert errors[-2] < errors[0]


def test_hard_limit_in_float32_matches_float64_hard_ece():
    logits, labels = _batch(1)
    keep = _away_from_edges(logits, 10, 2e-3)
    got = sb_ece(
        logits[keep].astype(np.float32), labels[keep], num_bins=10, temperature=1e-6
    )
    want = ref_hard_ece(logits[keep], labels[keep], num_bins=10, p=2.0, kind="lb")
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("temperature", [1e-1, 1e-2, 1e-3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_binned_is_at_least_binned(p, temperature, seed):
    logits, labels = _batch(seed, b=32)
    lb = float(sb_ece(logits, labels, p=p, temperature=temperature, kind="lb"))
    bn = float(sb_ece(logits, labels, p=p, temperature=temperature, kind="bin"))
    assert lb >= bn - 1e-6
    # Generic batches have within-bin spread of confidence: strictly larger.
    assert lb > bn + 1e-4


def test_value_matches_reference_for_several_settings():
    logits, labels = _batch(3, b=40, k=6)
    for kw in (
        {"kind": "lb", "p": 1.0, "temperature": 0.05, "num_bins": 5},
        {"kind": "bin", "p": 2.0, "temperature": 1e-4, "num_bins": 20},
        {"kind": "lb", "p": 3.0, "temperature": 1e-3, "num_bins": 1},
    ):
        got = sb_ece(logits.astype(np.float32), labels, **kw)
        want = ref_sb_ece(logits, labels, **kw)
        np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str(kw))


@pytest.mark.parametrize("kind", ["lb", "bin"])
def test_from_confidences_matches_float64_and_masks_rows(kind):
    # The public building block on confidences computed outside the loss: the
    # float64 reference of sb_ece on the same rows, and masked rows ignored.
    logits, labels = _batch(5, b=48, k=5)
    z = logits - logits.max(1, keepdims=True)
    conf = (1.0 / np.exp(z).sum(1)).astype(np.float32)
    correct = (logits.argmax(1) == labels).astype(np.float32)
    mask = np.ones(48, bool)
    mask[::4] = False
    kw = {"num_bins": 6, "kind": kind}
    got = sb_ece_from_confidences(conf, correct, mask, 0.02, 2.0, **kw)
    want = ref_sb_ece(logits[mask], labels[mask], temperature=0.02, p=2.0, **kw)
    np.testing.assert_allclose(float(got), want, rtol=2e-5)
    with pytest.raises(ValueError, match="kind"):
        sb_ece_from_confidences(conf, correct, mask, 0.02, 2.0, num_bins=6, kind="x")


def _calibrated_batch():
    """Every confidence is exactly 0.75 and exactly 3/4 of predictions are right."""
    k, b = 4, 16
    logits = np.zeros((b, k), np.float32)
    logits[:, 0] = math.log(9.0)  # softmax = (0.75, 1/12, 1/12, 1/12)
    labels = np.zeros(b, np.int32)
    labels[:4] = 1
    return logits, labels


@pytest.mark.long
@pytest.mark.parametrize("kind", ["lb", "bin"])
@pytest.mark.parametrize("temperature", [1e-4, 1e-2, 1.0])
def test_perfectly_calibrated_batch_gives_zero(kind, temperature):
    logits, labels = _calibrated_batch()
    value = sb_ece(logits, labels, kind=kind, temperature=temperature)
    assert abs(float(value)) < 1e-6
    grad = jax.grad(lambda x: sb_ece(x, labels, kind=kind))(jnp.asarray(logits))
    assert np.all(np.isfinite(grad))


def test_confident_and_correct_batch_gives_zero():
    logits, _ = _batch(4, b=16)
    labels = logits.argmax(1).astype(np.int32)
    value = sb_ece(logits.astype(np.float32) * 1e3, labels)
    assert float(value) == 0.0


def test_miscalibrated_batch_value_by_hand():
    # One bin (M = 1): lb = (mean_i |A - c_i|^p)^(1/p) with A the accuracy.
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]], np.float32)
    labels = np.array([0, 0, 1, 0], np.int32)
    p1 = 1.0 / (1.0 + np.exp(-np.array([2.0, 1.0, 0.5, 3.0])))
    acc = 0.5
    want_lb = np.sqrt(np.mean((acc - p1) ** 2))
    want_bin = abs(acc - p1.mean())
    got_lb = sb_ece(logits, labels, num_bins=1, kind="lb")
    got_bin = sb_ece(logits, labels, num_bins=1, kind="bin")
    np.testing.assert_allclose(got_lb, want_lb, rtol=1e-6)
    np.testing.assert_allclose(got_bin, want_bin, rtol=1e-6)


def test_soft_membership_rows_and_limit():
    conf = jnp.asarray([0.0, 0.03, 0.52, 0.71, 1.0])
    u = soft_bin_membership(conf, 10, 1e-5)
    np.testing.assert_allclose(jnp.sum(u, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(jnp.argmax(u, axis=1), [0, 0, 5, 7, 9])
    assert float(jnp.min(jnp.max(u, axis=1))) > 0.999
    soft = soft_bin_membership(conf, 10, 1.0)
    assert float(jnp.max(soft)) < 0.2


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"p": 0.5}, "p must be"),
        ({"num_bins": 0}, "num_bins"),
        ({"kind": "upper"}, "kind"),
    ],
)
def test_invalid_hyperparameters_raise(kw, match):
    logits, labels = _batch(5, b=8)
    with pytest.raises(ValueError, match=match):
        sb_ece(logits, labels, **kw)
