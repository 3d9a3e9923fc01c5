"""Focal, FLSD-53, inverse focal and dual focal: identities and hand values."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.losses._focal import dual_focal, focal, focal_adaptive, inverse_focal
from calib_jax.losses._primary import cross_entropy


def _batch(seed, b=16, k=6, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    labels = np.where(rng.random(b) < 0.5, logits.argmax(1), labels).astype(np.int32)
    return logits, labels


def _softmax64(logits):
    z = np.asarray(logits, np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _grad(fn, logits, labels, **kw):
    return np.asarray(
        jax.grad(lambda x: jnp.sum(fn(x, labels, **kw)))(jnp.asarray(logits))
    )


# --- focal -------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.parametrize("scale", [2.0, 50.0])
def test_focal_with_gamma_0_is_cross_entropy(scale):
    logits, labels = _batch(0, scale=scale)
    # cross_entropy is lse - z_y, whose absolute rounding error is ~ulp(|z|)
    # (focal's log-odds form is relatively accurate as p_y -> 1): atol ~ 50 ulp.
    np.testing.assert_allclose(
        focal(logits, labels, gamma=0.0),
        cross_entropy(logits, labels),
        rtol=1e-5,
        atol=scale * 1e-7,
    )
    np.testing.assert_allclose(
        _grad(focal, logits, labels, gamma=0.0),
        _grad(cross_entropy, logits, labels),
        atol=1e-6,
    )


def test_focal_hand_value():
    # p = softmax(2, 0, -1); (1 - p_0)^3 * (-log p_0).
    p0 = math.e**2 / (math.e**2 + 1 + math.e**-1)
    want = (1 - p0) ** 3 * -math.log(p0)
    got = focal(np.array([[2.0, 0.0, -1.0]], np.float32), np.array([0]))
    np.testing.assert_allclose(got, [want], rtol=1e-5)
    assert abs(want - 6.4735e-4) < 1e-7


def test_focal_decreases_with_gamma_and_is_below_cross_entropy():
    logits, labels = _batch(1)
    ce = np.asarray(cross_entropy(logits, labels))
    prev = ce
    for gamma in (0.5, 1.0, 3.0, 5.0):
        cur = np.asarray(focal(logits, labels, gamma=gamma))
        assert np.all(cur <= prev + 1e-7)
        assert np.all(cur < ce)
        prev = cur


@pytest.mark.long
def test_focal_gradient_vanishes_at_certainty_without_nan():
    # p_y = 1 to float32 precision: 1 - p_y cannot be formed as 1 - p.
    logits = np.array([[40.0, 0.0, 0.0], [1e4, 0.0, -1e4]], np.float32)
    for gamma in (0.0, 0.5, 3.0):
        g = _grad(focal, logits, np.array([0, 0]), gamma=gamma)
        assert np.all(np.isfinite(g))
        assert np.max(np.abs(g)) < 1e-15
    # ...and at the other end the gradient is the CE gradient times the weight ~1.
    g = _grad(focal, np.array([[0.0, 40.0, 0.0]], np.float32), np.array([0]))
    np.testing.assert_allclose(g, [[-1.0, 1.0, 0.0]], atol=1e-6)


def test_focal_gamma_is_traceable():
    logits, labels = _batch(2)
    gammas = jnp.array([0.0, 1.0, 3.0])
    batched = jax.vmap(lambda g: focal(logits, labels, gamma=g))(gammas)
    for i, g in enumerate([0.0, 1.0, 3.0]):
        np.testing.assert_allclose(batched[i], focal(logits, labels, gamma=g))
    dg = jax.grad(lambda g: jnp.sum(focal(logits, labels, gamma=g)))(2.0)
    assert np.isfinite(dg) and float(dg) < 0.0


def test_focal_rejects_negative_gamma():
    with pytest.raises(ValueError, match="gamma"):
        focal(*_batch(3), gamma=-1.0)


# --- FLSD-53 -----------------------------------------------------------------


def _two_class_logits(p_true):
    """Logits [log p, log(1 - p)] with true class 0."""
    return np.array([[math.log(p_true), math.log(1.0 - p_true)]], np.float32)


@pytest.mark.parametrize(
    "p_true, gamma", [(0.05, 5.0), (0.1999, 5.0), (0.2001, 3.0), (0.6, 3.0)]
)
def test_focal_adaptive_picks_gamma_by_true_class_probability(p_true, gamma):
    logits = _two_class_logits(p_true)
    labels = np.array([0])
    got = focal_adaptive(logits, labels)
    np.testing.assert_allclose(got, focal(logits, labels, gamma=gamma), rtol=1e-6)
    want = (1 - p_true) ** gamma * -math.log(p_true)
    np.testing.assert_allclose(got, [want], rtol=1e-4)
    # No gradient through the gamma rule: the gradient is focal's at that gamma.
    np.testing.assert_allclose(
        _grad(focal_adaptive, logits, labels),
        _grad(focal, logits, labels, gamma=gamma),
        rtol=1e-6,
    )


def test_focal_adaptive_uses_the_true_class_not_the_prediction():
    # Predicted class has p = 0.9 but the true class p = 0.05: gamma must be 5.
    logits = np.log(np.array([[0.05, 0.9, 0.05]], np.float32))
    got = focal_adaptive(logits, np.array([0]))
    np.testing.assert_allclose(got, focal(logits, np.array([0]), gamma=5.0), rtol=1e-6)
    assert abs(float(got[0]) - 0.95**5 * -math.log(0.05)) < 1e-4


def test_focal_adaptive_custom_rule():
    logits, labels = _batch(4)
    p = _softmax64(logits)[np.arange(16), labels]
    got = np.asarray(
        focal_adaptive(logits, labels, threshold=0.5, gamma_below=1.0, gamma_above=2.0)
    )
    low = p < 0.5
    assert low.any() and (~low).any()
    np.testing.assert_allclose(
        got[low], np.asarray(focal(logits, labels, gamma=1.0))[low], rtol=1e-6
    )
    np.testing.assert_allclose(
        got[~low], np.asarray(focal(logits, labels, gamma=2.0))[~low], rtol=1e-6
    )


def test_focal_adaptive_validation():
    x, y = _batch(5)
    with pytest.raises(ValueError, match="threshold"):
        focal_adaptive(x, y, threshold=1.5)
    with pytest.raises(ValueError, match="gamma_below"):
        focal_adaptive(x, y, gamma_below=-1.0)


# --- inverse focal -----------------------------------------------------------


def test_inverse_focal_hand_value_and_gamma_0():
    p0 = math.e**2 / (math.e**2 + 1 + math.e**-1)
    logits = np.array([[2.0, 0.0, -1.0]], np.float32)
    got = inverse_focal(logits, np.array([0]), gamma=2.0)
    np.testing.assert_allclose(got, [(1 + p0) ** 2 * -math.log(p0)], rtol=1e-5)
    x, y = _batch(6)
    np.testing.assert_allclose(
        inverse_focal(x, y, gamma=0.0), cross_entropy(x, y), rtol=1e-6
    )


def test_inverse_focal_weights_confident_samples_more():
    x, y = _batch(7)
    ratio = np.asarray(inverse_focal(x, y, gamma=1.5)) / np.asarray(cross_entropy(x, y))
    p = _softmax64(x)[np.arange(16), y]
    np.testing.assert_allclose(ratio, (1 + p) ** 1.5, rtol=1e-5)
    assert np.all(ratio >= 1.0)


# --- dual focal --------------------------------------------------------------


def test_dual_focal_hand_value_misclassified():
    # True class 0 with p_0 < p_1: p_j* = p_1 (the largest non-true class).
    z = np.array([1.0, 2.0, 0.0])
    p = np.exp(z) / np.exp(z).sum()
    logits = z[None].astype(np.float32)
    paper = (1 - p[0] + p[1]) ** 2 * -math.log(p[0])
    released = (1 - p[0]) ** 2 * -math.log(p[0])
    got = dual_focal(logits, np.array([0]), gamma=2.0)
    np.testing.assert_allclose(got, [paper], rtol=1e-5)
    assert abs(paper - 2.840346) < 1e-5  # p = (.2447, .6652, .0900)
    got = dual_focal(
        logits, np.array([0]), gamma=2.0, variant="reweighted_risk_description"
    )
    np.testing.assert_allclose(got, [released], rtol=1e-5)


def test_dual_focal_hand_value_correct():
    # True class 0 is the top class: p_j* is the runner-up p_1.
    z = np.array([2.0, 1.0, 0.5, -1.0])
    p = np.exp(z) / np.exp(z).sum()
    want = (1 - p[0] + p[1]) ** 3 * -math.log(p[0])
    for variant in ("paper", "reweighted_risk_description", "released_code"):
        got = dual_focal(
            z[None].astype(np.float32), np.array([0]), gamma=3.0, variant=variant
        )
        np.testing.assert_allclose(got, [want], rtol=1e-5)


def test_dual_focal_two_classes_closed_form():
    x, y = _batch(8, k=2)
    p = _softmax64(x)[np.arange(16), y]
    want = (2 * (1 - p)) ** 1.5 * -np.log(p)
    np.testing.assert_allclose(dual_focal(x, y, gamma=1.5), want, rtol=1e-5)


def test_dual_focal_variants_and_focal():
    x, y = _batch(9)
    correct = x.argmax(1) == y
    assert correct.any() and (~correct).any()
    paper = np.asarray(dual_focal(x, y, gamma=2.0))
    code = np.asarray(
        dual_focal(x, y, gamma=2.0, variant="reweighted_risk_description")
    )
    fl = np.asarray(focal(x, y, gamma=2.0))
    np.testing.assert_allclose(code[correct], paper[correct], rtol=1e-6)
    np.testing.assert_allclose(code[~correct], fl[~correct], rtol=1e-6)
    # The paper's weight is never below focal's (p_j* >= 0) and is above on
    # misclassified rows, which the released variant drops back to focal.
    assert np.all(paper >= fl - 1e-7)
    assert np.all(paper[~correct] > code[~correct] * 1.05)
    np.testing.assert_allclose(
        dual_focal(x, y, gamma=0.0), cross_entropy(x, y), rtol=1e-5
    )


def test_dual_focal_gradient_flows_through_the_competitor():
    z = np.array([[1.0, 2.0, 0.0]], np.float32)
    g = _grad(dual_focal, z, np.array([0]), gamma=2.0)

    # Finite differences in float64 on the paper's formula.
    def f(v):
        p = np.exp(v) / np.exp(v).sum()
        return (1 - p[0] + max(p[1], p[2])) ** 2 * -np.log(p[0])

    h = 1e-6
    num = [
        (f(z[0] + h * np.eye(3)[j]) - f(z[0] - h * np.eye(3)[j])) / (2 * h)
        for j in range(3)
    ]
    np.testing.assert_allclose(g[0], num, rtol=1e-4, atol=1e-6)


def test_dual_focal_at_tied_logits():
    # All classes tie: p_j* = p_y, the weight is 1 and the loss is CE; the
    # competitor's gradient goes to the first non-true class (class 1).
    logits = np.zeros((1, 4), np.float32)
    got = dual_focal(logits, np.array([0]), gamma=2.0)
    np.testing.assert_allclose(got, [math.log(4.0)], rtol=1e-6)
    g = _grad(dual_focal, logits, np.array([0]), gamma=2.0)[0]
    assert np.all(np.isfinite(g))
    assert abs(float(g.sum())) < 1e-6  # shift invariance
    np.testing.assert_allclose(g[2], g[3], rtol=1e-6)
    assert abs(g[1] - g[2]) > 0.1


def test_dual_focal_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        dual_focal(*_batch(10), variant="code")


# --- the shared true-vs-rest statistics at extreme rows ----------------------

# Label the unique maximum far above the rest (every other exponential
# underflows in float32 against the row max), tied with it, just below it,
# far below it; logits of magnitude 1e4.
_EXTREME_LOGITS = np.array(
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
_EXTREME_LABELS = np.array([0, 0, 1, 2, 0, 0, 0, 0], np.int32)


def _plain_focal64(z, y, gamma, dual):
    """Float64 focal / dual focal from the definitions, run with x64 enabled.

    ``log p_y = -softplus(logsumexp_{k != y} z_k - z_y)``, so that it keeps its
    relative accuracy as ``p_y -> 1`` (``z_y - logsumexp(z)`` does not); the
    competitor is the first arg-max among the other classes, whose derivative
    is the one ``dual_focal`` documents at ties.
    """
    others = jnp.arange(z.shape[1])[None, :] != y[:, None]
    rest = jnp.where(others, z, -jnp.inf)
    z_y = jnp.take_along_axis(z, y[:, None], 1)[:, 0]
    lse_rest = jax.nn.logsumexp(rest, axis=1)
    log_p = -jax.nn.softplus(lse_rest - z_y)
    lse = jnp.logaddexp(lse_rest, z_y)
    log_base = lse_rest - lse  # log(1 - p_y), also when it underflows
    if dual:
        first = jnp.argmax(rest, axis=1)
        log_base = jnp.logaddexp(
            log_base, jnp.take_along_axis(z, first[:, None], 1)[:, 0] - lse
        )
    return -jnp.exp(gamma * log_base) * log_p


@pytest.mark.long
@pytest.mark.parametrize("dual", [False, True], ids=["focal", "dual_focal"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 3.0])
def test_focal_family_at_extreme_rows_matches_float64(gamma, dual):
    fn = dual_focal if dual else focal
    x, y = _EXTREME_LOGITS, _EXTREME_LABELS
    got = np.asarray(fn(x, y, gamma=gamma))
    g = _grad(fn, x, y, gamma=gamma)
    with jax.enable_x64(True):
        want = np.asarray(
            _plain_focal64(jnp.asarray(x, jnp.float64), jnp.asarray(y), gamma, dual)
        )
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
        want = np.asarray(
            jax.grad(lambda v: jnp.sum(_plain_focal64(v, jnp.asarray(y), gamma, dual)))(
                jnp.asarray(x, jnp.float64)
            )
        )
    assert np.all(np.isfinite(g))
    # Rows with logits of magnitude 1e4: the competitor's log-probability is
    # z_j* - z_y + log p_y, which rounds at ulp(2e4) ~ 2e-3; hence the looser
    # rtol there.
    wide = np.abs(x).max(axis=1) > 1e3
    np.testing.assert_allclose(g[~wide], want[~wide], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g[wide], want[wide], rtol=1e-3, atol=1e-6)


@pytest.mark.long
@pytest.mark.parametrize(
    "fn, kw",
    [
        (focal, {"gamma": 0.5}),
        (focal, {"gamma": 3.0}),
        (focal_adaptive, {}),
        (dual_focal, {"gamma": 2.0}),
    ],
    ids=["focal_0.5", "focal_3", "focal_adaptive", "dual_focal"],
)
def test_focal_family_second_order_and_forward_mode(fn, kw):
    # The custom derivative rules serve jvp, vjp and their compositions.
    from jax.test_util import check_grads

    x, y = _batch(11, b=8, k=5, scale=3.0)
    x[0] = [30.0, 0.0, -5.0, 1.0, 2.0]  # the label far above the rest
    y[0] = 0
    with jax.enable_x64(True):
        check_grads(
            lambda v: fn(v, y, **kw),
            (jnp.asarray(x, jnp.float64),),
            order=2,
            modes=("fwd", "rev"),
            eps=1e-4,
        )
