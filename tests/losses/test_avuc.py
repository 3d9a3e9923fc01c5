"""AvUC / AvUC-GS / S-AvUC identities, gradient stopping and validation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import ref_avuc, ref_s_avuc

from calib_jax.losses._avuc import avuc, avuc_gs, s_avuc, soft_uncertainty


def _batch(seed, b=32, k=5, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k))
    labels = rng.integers(0, k, size=b)
    labels = np.where(rng.random(b) < 0.5, logits.argmax(1), labels)
    return logits, labels.astype(np.int32)


def _entropy_np(logits):
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return -(p * np.log(p)).sum(1)


@pytest.mark.parametrize("kappa", [0.2, 0.5, 0.8])
def test_avuc_gs_value_equals_avuc(kappa):
    logits, labels = _batch(0)
    a = avuc(logits.astype(np.float32), labels, kappa=kappa)
    b = avuc_gs(logits.astype(np.float32), labels, kappa=kappa)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, ref_avuc(logits, labels, kappa=kappa), rtol=1e-5)


def _frozen_confidence_avuc(logits, labels, conf, kappa):
    """Eqs. (13)-(14) in float64 NumPy with the confidences c_i held fixed."""
    h = _entropy_np(logits)
    k = logits.shape[1]
    right = logits.argmax(1) == labels
    unc = h / math.log(k) > kappa
    th = np.tanh(h)
    n_au = np.sum((right & unc) * conf * th)
    n_ic = np.sum((~right & ~unc) * (1 - conf) * (1 - th))
    n_ac = np.sum((right & ~unc) * conf * (1 - th))
    n_iu = np.sum((~right & unc) * (1 - conf) * th)
    return math.log(1 + (n_au + n_ic) / (n_ac + n_iu))


@pytest.mark.long
def test_avuc_gs_gradient_flows_only_through_tanh_of_entropy():
    """App. F: no gradient through the c_i and (1 - c_i) multiplicands."""
    logits, labels = _batch(1)
    kappa = 0.5
    z = logits - logits.max(1, keepdims=True)
    conf = 1.0 / np.exp(z).sum(1)
    # Central differences of the float64 reference with c frozen.
    eps = 1e-6
    want = np.zeros_like(logits)
    for i in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            up, dn = logits.copy(), logits.copy()
            up[i, j] += eps
            dn[i, j] -= eps
            want[i, j] = (
                _frozen_confidence_avuc(up, labels, conf, kappa)
                - _frozen_confidence_avuc(dn, labels, conf, kappa)
            ) / (2 * eps)
    with jax.enable_x64(True):
        x = jnp.asarray(logits, jnp.float64)
        got = np.asarray(jax.grad(lambda v: avuc_gs(v, labels, kappa=kappa))(x))
        full = np.asarray(jax.grad(lambda v: avuc(v, labels, kappa=kappa))(x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)
    # The full AvUC gradient is different (it also moves the confidences).
    assert np.max(np.abs(full - got)) > 1e-2


@pytest.mark.long
def test_avuc_pushes_inaccurate_certain_prediction_to_more_confidence():
    """Sec. 4.2 / App. F: minimising n_IC rewards raising c_i of an IC sample."""
    # Sample 0: wrong and certain (low entropy); sample 1: right and certain.
    logits = np.array([[6.0, 0.0, 0.0], [0.0, 6.0, 0.0]], np.float32)
    labels = np.array([1, 1], np.int32)
    g_full = jax.grad(lambda x: avuc(x, labels, kappa=0.5))(jnp.asarray(logits))
    g_gs = jax.grad(lambda x: avuc_gs(x, labels, kappa=0.5))(jnp.asarray(logits))
    # Descent direction -g on the wrong sample's top logit: AvUC raises it
    # (more confident in a wrong prediction); AvUC-GS lowers it.
    assert float(g_full[0, 0]) < 0.0
    assert float(g_gs[0, 0]) > 0.0


def test_all_accurate_and_certain_gives_zero():
    logits, _ = _batch(2, b=16)
    labels = logits.argmax(1).astype(np.int32)
    x = (logits * 10.0).astype(np.float32)
    assert float(avuc(x, labels, kappa=0.5)) == 0.0
    assert float(avuc_gs(x, labels, kappa=0.5)) == 0.0
    # S-AvUC: n'_AU = sum t_i tanh h_i -> 0 as the soft threshold sharpens.
    assert float(s_avuc(x, labels, kappa=0.5, temperature=0.01)) < 1e-6
    assert float(s_avuc(x, labels, kappa=0.5, temperature=1.0)) > 1e-3


def test_s_avuc_hard_limit():
    """T -> 0: t -> 1[h* > kappa], so Eq. (16) turns into hard-partition counts."""
    logits, labels = _batch(3)
    kappa = 0.6
    h = _entropy_np(logits)
    right = logits.argmax(1) == labels
    unc = h / math.log(logits.shape[1]) > kappa
    th = np.tanh(h)
    bad = np.sum((right & unc) * th) + np.sum((~right & ~unc) * (1 - th))
    good = np.sum((right & ~unc) * (1 - th)) + np.sum((~right & unc) * th)
    want = math.log(1 + bad / good)
    with jax.enable_x64(True):
        got = s_avuc(jnp.asarray(logits), labels, kappa=kappa, temperature=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert abs(float(s_avuc(logits, labels, kappa=kappa)) - want) > 1e-3


def test_s_avuc_matches_reference_at_defaults():
    logits, labels = _batch(4)
    np.testing.assert_allclose(
        s_avuc(logits.astype(np.float32), labels), ref_s_avuc(logits, labels), rtol=1e-5
    )


@pytest.mark.long
def test_soft_uncertainty_identity_and_threshold():
    h = jnp.linspace(0.0, 1.0, 11)
    np.testing.assert_allclose(soft_uncertainty(h, 0.5, 1.0), h, atol=1e-6)
    sharp = soft_uncertainty(jnp.asarray([0.1, 0.29, 0.31, 0.9]), 0.3, 1e-3)
    np.testing.assert_allclose(sharp, [0.0, 0.0, 1.0, 1.0], atol=1e-6)
    assert float(soft_uncertainty(jnp.asarray([0.3]), 0.3, 0.1)[0]) == pytest.approx(
        0.5
    )


@pytest.mark.parametrize(
    "fn, kw, match",
    [
        (avuc, {"kappa": -0.1}, "kappa"),
        (avuc, {"kappa": 1.5}, "kappa"),
        (avuc_gs, {"kappa": 2.0}, "kappa"),
        (s_avuc, {"kappa": 0.0}, "kappa"),
        (s_avuc, {"kappa": 1.0}, "kappa"),
        (s_avuc, {"temperature": 0.0}, "temperature"),
    ],
)
def test_invalid_hyperparameters_raise(fn, kw, match):
    logits, labels = _batch(5, b=8)
    with pytest.raises(ValueError, match=match):
        fn(logits, labels, **kw)


@pytest.mark.parametrize("fn", [avuc, avuc_gs, s_avuc])
def test_single_class_is_rejected(fn):
    with pytest.raises(ValueError, match="K >= 2"):
        fn(np.zeros((4, 1), np.float32), np.zeros(4, np.int32))
