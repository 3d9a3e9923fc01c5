"""MbLS and ACLS (Eqs. (12)-(13)): identities, hand values, gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import ref_acls_logit_grad

from calib_jax.losses._margin import acls, acls_logit_grad, mbls


def _batch(seed, b=16, k=6, scale=8.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    return logits, labels


def _grad(fn, logits, labels, **kw):
    return np.asarray(
        jax.grad(lambda x: jnp.sum(fn(x, labels, **kw)))(jnp.asarray(logits))
    )


# --- MbLS --------------------------------------------------------------------


def test_mbls_is_zero_when_all_margins_are_within_m():
    rng = np.random.default_rng(0)
    logits = rng.uniform(-4.0, 5.0, size=(8, 7)).astype(np.float32)
    labels = np.zeros(8, np.int32)
    np.testing.assert_array_equal(mbls(logits, labels), 0.0)
    np.testing.assert_array_equal(_grad(mbls, logits, labels), 0.0)
    # ...and positive once the margin is below the spread.
    assert np.all(np.asarray(mbls(logits, labels, margin=0.5)) > 0.0)


def test_mbls_hand_value_and_gradient():
    logits = np.array([[12.0, 0.0, 1.0, 11.0]], np.float32)
    labels = np.array([3])  # labels play no role
    # Hinges: 12 - 0 - 10 = 2, 12 - 1 - 10 = 1, the others inactive.
    np.testing.assert_allclose(mbls(logits, labels), [0.3], rtol=1e-6)
    np.testing.assert_allclose(mbls(logits, labels, alpha=1.0), [3.0], rtol=1e-6)
    # The max is differentiated: +alpha per active hinge on the arg-max logit.
    np.testing.assert_allclose(
        _grad(mbls, logits, labels), [[0.2, -0.1, -0.1, 0.0]], atol=1e-7
    )


def test_mbls_and_acls_tie_gradient_goes_to_the_first_maximum():
    logits = np.array([[5.0, 5.0, -10.0]], np.float32)
    labels = np.array([0])
    # One active hinge (5 - (-10) - 10 = 5): +alpha to class 0 only.
    np.testing.assert_allclose(mbls(logits, labels), [0.5], rtol=1e-6)
    np.testing.assert_allclose(
        _grad(mbls, logits, labels), [[0.1, 0.0, -0.1]], atol=1e-7
    )
    # ACLS: pos = 0.1 * 5^2, neg = 0.01 * 5^2; d/dz_0 = 2*0.1*5 + 2*0.01*5.
    np.testing.assert_allclose(acls(logits, labels), [2.75], rtol=1e-6)
    np.testing.assert_allclose(
        _grad(acls, logits, labels), [[1.1, 0.0, -1.1]], rtol=1e-6
    )
    np.testing.assert_allclose(
        acls_logit_grad(logits, labels), [[0.5, 0.0, -0.05]], rtol=1e-6
    )


def test_mbls_validation():
    x, y = _batch(1)
    with pytest.raises(ValueError, match="margin"):
        mbls(x, y, margin=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        mbls(x, y, alpha=-0.1)


# --- ACLS --------------------------------------------------------------------


def test_acls_hand_value():
    logits = np.array([[13.0, 0.0, 1.0], [1.0, 0.0, 0.0]], np.float32)
    # 0.1 * (13 - 0 - 10)^2 + 0.01 * ((13 - 0 - 10)^2 + (13 - 1 - 10)^2); 0.
    np.testing.assert_allclose(acls(logits, np.array([0, 1])), [1.03, 0.0], rtol=1e-6)
    got = acls(logits, np.array([0, 1]), margin=0.5, lambda_1=1.0, lambda_2=0.0)
    np.testing.assert_allclose(got, [12.5**2, 0.5**2], rtol=1e-6)


def test_acls_is_zero_within_the_margin():
    rng = np.random.default_rng(2)
    logits = rng.uniform(0.0, 9.9, size=(8, 5)).astype(np.float32)
    labels = np.zeros(8, np.int32)
    np.testing.assert_array_equal(acls(logits, labels), 0.0)
    np.testing.assert_array_equal(_grad(acls, logits, labels), 0.0)


def test_acls_logit_grad_matches_reference():
    logits, labels = _batch(3, k=7)
    kw = {"margin": 4.0, "lambda_1": 0.2, "lambda_2": 0.05}
    got = acls_logit_grad(logits, labels, **kw)
    want = ref_acls_logit_grad(logits.astype(np.float64), labels, **kw)
    assert got.shape == (16, 7) and got.dtype == jnp.float32
    assert np.count_nonzero(want) > 30  # the hinges are active
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Defaults and the paper's hand example.
    g = acls_logit_grad(np.array([[13.0, 0.0, 1.0]], np.float32), np.array([0]))
    np.testing.assert_allclose(g, [[0.3, -0.03, -0.02]], rtol=1e-6)


@pytest.mark.long
def test_acls_logit_grad_is_half_the_gradient_of_eq13_with_stop_gradients():
    """Eq. (12) = 1/2 grad of Eq. (13) with min_k z_k and z_yhat held fixed."""
    logits, labels = _batch(4, k=6)
    m, l1, l2 = 5.0, 0.1, 0.01

    def eq13_stopped(z):
        top = jnp.max(z, axis=1)
        low = jax.lax.stop_gradient(jnp.min(z, axis=1))
        pos = l1 * jax.nn.relu(top - low - m) ** 2
        top_c = jax.lax.stop_gradient(top)[:, None]
        neg = l2 * jnp.sum(jax.nn.relu(top_c - z - m) ** 2, axis=1)
        return jnp.sum(pos + neg)

    paper = acls_logit_grad(logits, labels, margin=m, lambda_1=l1, lambda_2=l2)
    assert np.count_nonzero(np.asarray(paper)) > 30
    half = 0.5 * jax.grad(eq13_stopped)(jnp.asarray(logits))
    np.testing.assert_allclose(paper, half, rtol=1e-5, atol=1e-7)


def test_acls_exact_gradient_differs_from_eq12_by_the_documented_terms():
    logits, labels = _batch(5, k=6)
    m, l1, l2 = 5.0, 0.1, 0.01
    eq12 = np.asarray(
        acls_logit_grad(logits, labels, margin=m, lambda_1=l1, lambda_2=l2),
        np.float64,
    )
    exact = _grad(acls, logits, labels, margin=m, lambda_1=l1, lambda_2=l2)
    rows = np.arange(len(labels))
    pred, low = logits.argmax(1), logits.argmin(1)
    z = logits.astype(np.float64)
    top, bottom = z.max(1), z.min(1)
    want = 2.0 * eq12
    # d/dz_yhat of the j != yhat terms.
    want[rows, pred] += 2.0 * l2 * np.maximum(top[:, None] - z - m, 0.0).sum(1)
    # d/d(min) of the yhat term.
    want[rows, low] -= 2.0 * l1 * np.maximum(top - bottom - m, 0.0)
    np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-6)
    # The two really differ (not only by the factor 2).
    assert np.max(np.abs(exact - 2.0 * eq12)) > 1e-2


def test_acls_logit_grad_where_jit_and_bf16():
    logits, labels = _batch(6)
    mask = np.arange(16) % 3 != 0
    dirty = logits.copy()
    dirty[~mask] = np.nan
    got = np.asarray(acls_logit_grad(dirty, labels, where=jnp.asarray(mask)))
    np.testing.assert_array_equal(got[~mask], 0.0)
    np.testing.assert_allclose(
        got[mask], acls_logit_grad(logits[mask], labels[mask]), rtol=1e-6
    )
    jitted = jax.jit(lambda x, y: acls_logit_grad(x, y))(logits, labels)
    np.testing.assert_allclose(jitted, acls_logit_grad(logits, labels), rtol=1e-6)
    low = acls_logit_grad(jnp.asarray(logits, jnp.bfloat16), labels)
    assert low.dtype == jnp.float32 and low.shape == (16, 6)


def test_acls_validation():
    x, y = _batch(7)
    for name in ("margin", "lambda_1", "lambda_2"):
        with pytest.raises(ValueError, match=name):
            acls(x, y, **{name: -1.0})
        with pytest.raises(ValueError, match=name):
            acls_logit_grad(x, y, **{name: -1.0})
