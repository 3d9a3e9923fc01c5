"""Cross-entropy, label smoothing and Brier: identities and hand-checked values."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from calib_jax import metrics
from calib_jax.losses._primary import brier, cross_entropy, label_smoothing


def _batch(seed, b=16, k=6, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    return logits, labels


def _log_softmax64(logits):
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


# --- cross-entropy -----------------------------------------------------------


def test_cross_entropy_hand_value():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]], np.float32)
    got = cross_entropy(logits, np.array([0, 2]))
    want = [math.log(math.e**2 + 1 + math.e**-1) - 2.0, math.log(3.0)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cross_entropy_matches_optax():
    logits, labels = _batch(0)
    want = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    np.testing.assert_allclose(cross_entropy(logits, labels), want, rtol=1e-6)


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    logits, labels = _batch(1)
    g = jax.grad(lambda x: jnp.sum(cross_entropy(x, labels)))(jnp.asarray(logits))
    p = np.exp(_log_softmax64(logits))
    p[np.arange(len(labels)), labels] -= 1.0
    np.testing.assert_allclose(g, p, atol=1e-6)


def test_one_class_is_rejected():
    with pytest.raises(ValueError, match="at least 2 classes"):
        cross_entropy(np.zeros((3, 1), np.float32), np.zeros(3, np.int32))


# --- label smoothing ---------------------------------------------------------


@pytest.mark.parametrize("off_target", ["uniform", "others"])
def test_label_smoothing_with_epsilon_0_is_cross_entropy(off_target):
    logits, labels = _batch(2)
    got = label_smoothing(logits, labels, epsilon=0.0, off_target=off_target)
    np.testing.assert_allclose(got, cross_entropy(logits, labels), rtol=1e-6)


def test_label_smoothing_uniform_hand_value():
    # q = (0.9 + 0.1/3, 0.1/3, 0.1/3): ACLS Eq. (4) with C = 3.
    logits = np.array([[2.0, 0.0, -1.0]], np.float32)
    logp = _log_softmax64(logits)[0]
    want = -(0.9 + 0.1 / 3) * logp[0] - (0.1 / 3) * (logp[1] + logp[2])
    got = label_smoothing(logits, np.array([0]), epsilon=0.1)
    np.testing.assert_allclose(got, [want], rtol=1e-6)
    assert abs(float(got[0]) - 0.3365128) < 1e-6


def test_label_smoothing_others_hand_value():
    # q = (0.9, 0.05, 0.05): the mass goes to the K - 1 other classes only.
    logits = np.array([[2.0, 0.0, -1.0]], np.float32)
    logp = _log_softmax64(logits)[0]
    want = -0.9 * logp[0] - 0.05 * (logp[1] + logp[2])
    got = label_smoothing(logits, np.array([0]), epsilon=0.1, off_target="others")
    np.testing.assert_allclose(got, [want], rtol=1e-6)


def test_label_smoothing_conventions_differ_as_the_formulas_say():
    logits, labels = _batch(3, k=7)
    k, eps = 7, 0.3
    nll = -_log_softmax64(logits)  # [B, K]
    nll_y = nll[np.arange(len(labels)), labels]
    mean_all = nll.mean(axis=1)
    mean_others = (nll.sum(axis=1) - nll_y) / (k - 1)
    uni = np.asarray(label_smoothing(logits, labels, epsilon=eps), np.float64)
    oth = np.asarray(
        label_smoothing(logits, labels, epsilon=eps, off_target="others"), np.float64
    )
    np.testing.assert_allclose(uni - oth, eps * (mean_all - mean_others), atol=2e-6)
    assert np.max(np.abs(uni - oth)) > 1e-2  # the difference is not negligible
    # uniform with eps is others with eps (K - 1) / K.
    same = label_smoothing(
        logits, labels, epsilon=eps * (k - 1) / k, off_target="others"
    )
    np.testing.assert_allclose(uni, same, rtol=1e-5)


def test_label_smoothing_uniform_matches_optax_smooth_labels():
    logits, labels = _batch(4, k=5)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, 5), 0.2)
    want = optax.softmax_cross_entropy(logits, targets)
    np.testing.assert_allclose(
        label_smoothing(logits, labels, epsilon=0.2), want, rtol=1e-5
    )


def test_label_smoothing_gradient_is_p_minus_smoothed_target():
    # ACLS Eq. (5): dL/dz_j = p_j - q'_j.
    logits, labels = _batch(5, k=4)
    eps = 0.2
    g = jax.grad(lambda x: jnp.sum(label_smoothing(x, labels, epsilon=eps)))(
        jnp.asarray(logits)
    )
    q = np.full(logits.shape, eps / 4)
    q[np.arange(len(labels)), labels] += 1.0 - eps
    np.testing.assert_allclose(g, np.exp(_log_softmax64(logits)) - q, atol=1e-6)


def test_label_smoothing_validation():
    x, y = _batch(6)
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothing(x, y, epsilon=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothing(x, y, epsilon=-0.1)
    with pytest.raises(ValueError, match="off_target"):
        label_smoothing(x, y, off_target="all")


# --- Brier -------------------------------------------------------------------


def test_brier_hand_values():
    logits = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [-30.0, 30.0]], np.float32)
    logits4 = np.zeros((1, 4), np.float32)
    got = brier(logits, np.array([0, 0, 1, 0]))
    p = 1.0 / (1.0 + math.exp(-2.0))
    np.testing.assert_allclose(got, [0.5, 2 * (1 - p) ** 2, 0.5, 2.0], rtol=1e-6)
    # Not divided by K: uniform over 4 classes gives 0.75^2 + 3 * 0.25^2.
    np.testing.assert_allclose(brier(logits4, np.array([2])), [0.75], rtol=1e-6)


def test_brier_mean_equals_the_brier_metric():
    logits, labels = _batch(7)
    probs = jax.nn.softmax(jnp.asarray(logits))
    np.testing.assert_allclose(
        float(jnp.mean(brier(logits, labels))),
        float(metrics.brier(probs, labels)),
        rtol=1e-5,
    )


def test_brier_is_accurate_near_certainty():
    # 1 - p_y ~ 2e-9 would round to 0 in float32 as 1 - p_y.
    logits = np.array([[20.0, 0.0, 0.0]], np.float32)
    want = 2 * math.exp(-20) / (1 + 2 * math.exp(-20))  # 1 - p_y
    want = want**2 + 2 * (math.exp(-20) / (1 + 2 * math.exp(-20))) ** 2
    np.testing.assert_allclose(brier(logits, np.array([0])), [want], rtol=1e-5)


def _plain_brier64(z, y):
    """Float64 Brier score from the definition (run with x64 enabled)."""
    p = jax.nn.softmax(z, axis=1)
    others = jnp.arange(z.shape[1])[None, :] != y[:, None]
    rest = jnp.where(others, p, 0.0)
    return jnp.sum(rest, axis=1) ** 2 + jnp.sum(rest * rest, axis=1)


@pytest.mark.long
def test_brier_at_extreme_rows_matches_float64():
    # The label the unique maximum far above the rest, tied with it, just
    # below it, far below it; logits of magnitude 1e4.
    x = np.array(
        [
            [200.0, 0.0, -5.0, 1.0, 2.0, 3.0],
            [30.0, 0.0, -5.0, 1.0, 2.0, 3.0],
            [5.0, 5.0, 0.0, 0.0, 0.0, 0.0],
            [5.0, 5.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 50.0, 0.0, 0.0, 0.0, 0.0],
            [3.0, 2.9999998, 0.0, 1.0, 2.0, -1.0],
            [1e4, 0.0, -1e4, 0.0, 0.0, 0.0],
            [-1e4, 1e4, 0.0, 0.0, 0.0, 0.0],
        ],
        np.float32,
    )
    y = np.array([0, 0, 1, 2, 0, 0, 0, 0], np.int32)
    got = np.asarray(brier(x, y))
    g = np.asarray(jax.grad(lambda v: jnp.sum(brier(v, y)))(jnp.asarray(x)))
    with jax.enable_x64(True):
        x64 = jnp.asarray(x, jnp.float64)
        want = np.asarray(_plain_brier64(x64, jnp.asarray(y)))
        want_g = np.asarray(
            jax.grad(lambda v: jnp.sum(_plain_brier64(v, jnp.asarray(y))))(x64)
        )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-6)


@pytest.mark.long
def test_brier_second_order_and_forward_mode():
    # The custom derivative rule serves jvp, vjp and their compositions.
    from jax.test_util import check_grads

    x, y = _batch(12, b=8, k=5, scale=3.0)
    x[0] = [30.0, 0.0, -5.0, 1.0, 2.0]  # the label far above the rest
    y[0] = 0
    with jax.enable_x64(True):
        check_grads(
            lambda v: brier(v, y),
            (jnp.asarray(x, jnp.float64),),
            order=2,
            modes=("fwd", "rev"),
            eps=1e-4,
        )
