"""AURC / AU_Pxτ identities, histogram threading, CSFs and validation."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import (
    ref_au_pxtau,
    ref_au_pxtau_weights,
    ref_aurc,
    ref_csf,
)
from jax.test_util import check_grads

from calib_jax import losses
from calib_jax.losses._selective import (
    au_pxtau,
    au_pxtau_update_hist,
    au_pxtau_weights,
    aurc,
    msp,
    neg_entropy,
    softmax_margin,
)

CSFS = ["msp", "neg_entropy", "softmax_margin"]
CSF_FNS = {"msp": msp, "neg_entropy": neg_entropy, "softmax_margin": softmax_margin}


def _batch(seed, b=24, k=5, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k))
    labels = rng.integers(0, k, size=b)
    labels = np.where(rng.random(b) < 0.5, logits.argmax(1), labels)
    return logits, labels.astype(np.int32)


def _ce(logits, labels):
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return -logp[np.arange(len(labels)), labels]


def _scores(logits, csf):
    z = logits - logits.max(1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return np.array([ref_csf(row, csf) for row in probs])


# --- AURC -------------------------------------------------------------------


@pytest.mark.parametrize("csf", CSFS)
def test_aurc_equals_mean_of_selective_risks_over_all_coverages(csf):
    logits, labels = _batch(0)
    want = ref_aurc(logits, labels, csf=csf)
    with jax.enable_x64(True):
        got = aurc(jnp.asarray(logits), labels, csf=csf)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(
        aurc(logits.astype(np.float32), labels, csf=csf), want, rtol=1e-5
    )


def test_aurc_with_ties_averages_over_tie_breaking():
    logits, labels = _batch(1, b=6)
    # Two exact duplicates of row 0 with other labels: three tied scores.
    logits = np.concatenate([logits, logits[:1], logits[:1]])
    labels = np.concatenate([labels, [(labels[0] + 1) % 5, (labels[0] + 2) % 5]])
    losses = _ce(logits, labels)
    scores = _scores(logits, "msp")
    n = len(scores)
    tied = [0, n - 2, n - 1]
    others = sorted(set(range(n)) - set(tied), key=lambda i: -scores[i])
    above = [i for i in others if scores[i] > scores[0]]
    below = [i for i in others if scores[i] < scores[0]]
    values = []
    for perm in itertools.permutations(tied):
        order = above + list(perm) + below
        risks = [np.mean(losses[order[:m]]) for m in range(1, n + 1)]
        values.append(np.mean(risks))
    with jax.enable_x64(True):
        got = aurc(jnp.asarray(logits), jnp.asarray(labels))
        # Permuting the rows cannot change the value.
        rev = aurc(jnp.asarray(logits[::-1]), jnp.asarray(labels[::-1]))
    np.testing.assert_allclose(got, np.mean(values), rtol=1e-12)
    np.testing.assert_allclose(rev, got, rtol=1e-12)
    assert np.ptp(values) > 1e-3  # the tie really matters for this batch


def test_aurc_gradient_is_rank_weighted_cross_entropy_gradient():
    """The ranking weights carry no gradient: grad = (1/n) sum alpha_i grad CE_i."""
    logits, labels = _batch(2, b=16)
    scores = _scores(logits, "msp")
    n = len(scores)
    rank = np.empty(n, int)
    rank[np.argsort(-scores)] = np.arange(1, n + 1)
    alpha = np.array([sum(1.0 / m for m in range(r, n + 1)) for r in rank])
    with jax.enable_x64(True):
        x = jnp.asarray(logits)
        got = jax.grad(lambda v: aurc(v, labels))(x)
        p = jax.nn.softmax(x, axis=1)
        want = alpha[:, None] * (p - jax.nn.one_hot(labels, 5)) / n
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


def test_aurc_is_small_for_a_confident_correct_batch():
    labels = np.arange(16, dtype=np.int32) % 5
    logits = 20.0 * np.eye(5, dtype=np.float32)[labels]
    value = float(aurc(logits, labels))
    # Every CE is log(1 + 4 e^-20) ~ 8e-9 (0 in float32); the weights average 1.
    assert 0.0 <= value < 1e-7
    with jax.enable_x64(True):
        exact = float(aurc(jnp.asarray(logits, jnp.float64), labels))
    np.testing.assert_allclose(exact, math.log1p(4 * math.exp(-20.0)), rtol=1e-6)


# --- AU_Pxτ -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [{"tau": 0.6}, {"coverage": 0.5}, {"csf": "neg_entropy", "tau": -0.8}],
    ids=["tau", "coverage", "neg_entropy"],
)
def test_au_pxtau_weights_are_equal_above_tau_and_rank_based_below(kw):
    logits, _ = _batch(4, b=40)
    w = np.asarray(au_pxtau_weights(logits.astype(np.float32), **kw))
    want = ref_au_pxtau_weights(logits, **kw)
    np.testing.assert_allclose(w, want, rtol=1e-5)
    csf = kw.get("csf", "msp")
    g = _scores(logits, csf)
    if "tau" in kw:
        tau = kw["tau"]
    else:  # the coverage quantile lies between the low and high groups
        tau = (g[w == w.max()].min() + g[w < w.max()].max()) / 2
    high, low = g >= tau, g < tau
    assert high.sum() >= 5 and low.sum() >= 5
    # One common weight for all samples at or above tau ...
    assert np.ptp(w[high]) == 0.0
    # ... and below tau weights that grow with the score, and stay below it.
    order = np.argsort(g[low])
    assert np.all(np.diff(w[low][order]) > 0)
    assert w[low].max() < w[high][0]


def test_au_pxtau_is_mean_of_weighted_cross_entropy():
    logits, labels = _batch(5, b=32)
    x = logits.astype(np.float32)
    w = au_pxtau_weights(x, coverage=0.7, nu=0.05)
    want = float(np.mean(np.asarray(w) * _ce(logits, labels)))
    np.testing.assert_allclose(
        au_pxtau(x, labels, coverage=0.7, nu=0.05), want, rtol=1e-5
    )
    np.testing.assert_allclose(
        want, ref_au_pxtau(logits, labels, coverage=0.7, nu=0.05), rtol=1e-5
    )


@pytest.mark.long
def test_au_pxtau_gradient_flows_through_weights_only_below_tau():
    """App. C.4, Eq. (27): weights above tau are constants, below they are not."""
    logits, labels = _batch(6, b=32)
    tau = 0.6
    with jax.enable_x64(True):
        x = jnp.asarray(logits)
        g_full = np.asarray(jax.grad(lambda v: au_pxtau(v, labels, tau=tau))(x))

        def frozen(v):
            w = jax.lax.stop_gradient(au_pxtau_weights(v, tau=tau))
            ce = -jnp.take_along_axis(jax.nn.log_softmax(v), labels[:, None], 1)[:, 0]
            return jnp.mean(w * ce)

        g_frozen = np.asarray(jax.grad(frozen)(x))
    high = _scores(logits, "msp") >= tau
    assert high.sum() >= 5 and (~high).sum() >= 5
    np.testing.assert_allclose(g_full[high], g_frozen[high], rtol=1e-10, atol=1e-14)
    assert np.all(np.abs(g_full[~high] - g_frozen[~high]).max(axis=1) > 1e-6)


def test_au_pxtau_weight_grad_false_is_the_frozen_weight_gradient():
    """weight_grad=False: same value, gradient beta_i * grad(ce_i) only."""
    logits, labels = _batch(16, b=32)
    tau = 0.6
    with jax.enable_x64(True):
        x = jnp.asarray(logits)

        def frozen(v):
            w = jax.lax.stop_gradient(au_pxtau_weights(v, tau=tau))
            ce = -jnp.take_along_axis(jax.nn.log_softmax(v), labels[:, None], 1)[:, 0]
            return jnp.mean(w * ce)

        def off(v):
            return au_pxtau(v, labels, tau=tau, weight_grad=False)

        np.testing.assert_allclose(
            off(x), au_pxtau(x, labels, tau=tau), rtol=1e-12, atol=0
        )
        np.testing.assert_allclose(
            np.asarray(jax.grad(off)(x)),
            np.asarray(jax.grad(frozen)(x)),
            rtol=1e-10,
            atol=1e-14,
        )
        w_grad = jax.grad(lambda v: jnp.sum(au_pxtau_weights(v, tau=tau)))(x)
        w_off = jax.grad(
            lambda v: jnp.sum(au_pxtau_weights(v, tau=tau, weight_grad=False))
        )(x)
    assert np.abs(np.asarray(w_grad)).max() > 1e-3
    assert np.all(np.asarray(w_off) == 0.0)


@pytest.mark.parametrize("bad", [0, 1, "yes", None])
def test_au_pxtau_weight_grad_must_be_a_bool(bad):
    logits, labels = _batch(17, b=8)
    with pytest.raises(ValueError, match="weight_grad must be True or False"):
        au_pxtau(logits.astype(np.float32), labels, weight_grad=bad)
    with pytest.raises(ValueError, match="weight_grad must be True or False"):
        losses.get_loss("au_pxtau", weight_grad=bad)


def test_coverage_sets_the_fraction_of_low_confidence_samples():
    logits, _ = _batch(7, b=800, k=10)
    g = _scores(logits, "msp")
    for coverage in (0.3, 0.6, 0.9):
        w = np.asarray(au_pxtau_weights(logits.astype(np.float32), coverage=coverage))
        low = np.mean(w < w.max())
        assert abs(low - coverage) < 0.02, (coverage, low)
    w = np.asarray(au_pxtau_weights(logits.astype(np.float32), coverage=1.0))
    assert np.mean(w < w.max()) == np.mean(g < g.max())


def test_hist_threading_equals_weighting_with_the_pooled_histogram():
    """Running counts over batches = the CDF of all scores seen so far."""
    prev, _ = _batch(8, b=24)
    cur, labels = _batch(9, b=16)
    hist = jnp.zeros(15)
    hist = au_pxtau_update_hist(hist, prev.astype(np.float32))
    hist = au_pxtau_update_hist(hist, cur.astype(np.float32))  # before the loss
    assert float(jnp.sum(hist)) == 40.0
    got = au_pxtau(cur.astype(np.float32), labels, hist=hist, coverage=0.8)
    pooled = np.concatenate([prev, cur]).astype(np.float32)
    w = np.asarray(au_pxtau_weights(pooled, coverage=0.8))[len(prev) :]
    want = np.mean(w * _ce(cur, labels))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # The batch's own histogram gives a different loss.
    alone = float(au_pxtau(cur.astype(np.float32), labels, coverage=0.8))
    assert abs(alone - float(got)) > 1e-4
    # hist = this batch's counts reproduces hist=None exactly.
    own = au_pxtau_update_hist(jnp.zeros(15), cur.astype(np.float32))
    np.testing.assert_allclose(
        au_pxtau(cur.astype(np.float32), labels, hist=own, coverage=0.8),
        alone,
        rtol=1e-6,
    )


def test_update_hist_counts_decay_and_mask():
    logits = np.array([[0.0, 0.0], [5.0, 0.0], [0.2, 0.0], [9.0, 0.0]], np.float32)
    # MSP = 0.5, 0.993, 0.55, 0.9999 in 4 bins of width 0.25.
    counts = au_pxtau_update_hist(jnp.zeros(4), logits)
    np.testing.assert_array_equal(counts, [0, 0, 2, 2])
    decayed = au_pxtau_update_hist(counts, logits, decay=0.5)
    np.testing.assert_array_equal(decayed, [0, 0, 3, 3])
    mask = jnp.asarray([True, False, True, False])
    np.testing.assert_array_equal(
        au_pxtau_update_hist(jnp.zeros(4), logits, where=mask), [0, 0, 2, 0]
    )
    # The top of the range (MSP == 1) falls in the last, closed bin.
    top = au_pxtau_update_hist(jnp.zeros(4), np.array([[1e4, 0.0]], np.float32))
    np.testing.assert_array_equal(top, [0, 0, 0, 1])
    ent = au_pxtau_update_hist(jnp.zeros(2), logits, csf="neg_entropy")
    np.testing.assert_array_equal(ent, [2, 2])  # entropies 0.69, 0.04, 0.69, 0.001


# --- Confidence score functions ---------------------------------------------


@pytest.mark.parametrize("csf", CSFS)
def test_csf_values_match_reference(csf):
    logits, _ = _batch(10, b=16, k=6)
    got = CSF_FNS[csf](logits.astype(np.float32))
    assert got.dtype == jnp.float32 and got.shape == (16,)
    np.testing.assert_allclose(got, _scores(logits, csf), rtol=1e-5, atol=1e-6)
    low = CSF_FNS[csf](jnp.asarray(logits, jnp.bfloat16))
    assert low.dtype == jnp.float32


def test_csf_edge_cases():
    uniform = np.zeros((1, 4), np.float32)
    np.testing.assert_allclose(msp(uniform), 0.25)
    np.testing.assert_allclose(neg_entropy(uniform), -math.log(4.0), rtol=1e-6)
    np.testing.assert_allclose(softmax_margin(uniform), 0.0)
    one_hot = np.array([[1e4, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(msp(one_hot), 1.0)
    np.testing.assert_allclose(neg_entropy(one_hot), 0.0)
    np.testing.assert_allclose(softmax_margin(one_hot), 1.0)
    np.testing.assert_allclose(softmax_margin(np.zeros((2, 1), np.float32)), 1.0)


@pytest.mark.long
@pytest.mark.parametrize("csf", CSFS)
def test_csf_derivatives_in_forward_and_reverse_mode(csf):
    """The closed-form derivative rule serves jvp and vjp alike."""
    logits, _ = _batch(13, b=8, k=5)
    with jax.enable_x64(True):
        check_grads(
            CSF_FNS[csf],
            (jnp.asarray(logits),),
            order=2,
            modes=("fwd", "rev"),
            eps=1e-5,
            rtol=1e-5,
            atol=1e-8,
        )


def test_msp_gradient_splits_evenly_between_tied_maxima():
    logits = np.array([[1.0, 1.0, 0.0]], np.float32)
    g = np.asarray(jax.grad(lambda x: msp(x)[0])(jnp.asarray(logits)))[0]
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    c = p.max()
    np.testing.assert_allclose(g, c * (np.array([0.5, 0.5, 0.0]) - p), rtol=1e-6)
    # A tie at the top gives a margin of 0 with zero gradient.
    gm = jax.grad(lambda x: softmax_margin(x)[0])(jnp.asarray(logits))
    assert float(softmax_margin(logits)[0]) == 0.0
    np.testing.assert_array_equal(gm, 0.0)


# --- Validation -------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"nu": 0.0}, "nu"),
        ({"nu": -1.0}, "nu"),
        ({"num_bins": 0}, "num_bins"),
        ({"coverage": 0.0}, "coverage"),
        ({"coverage": 1.5}, "coverage"),
        ({"tau": 0.5, "coverage": 0.5}, "at most one"),
        ({"csf": "energy"}, "csf"),
        ({"hist": np.zeros(3)}, "hist"),
    ],
)
def test_au_pxtau_invalid_arguments_raise(kw, match):
    logits, labels = _batch(11, b=8)
    with pytest.raises(ValueError, match=match):
        au_pxtau(logits, labels, **kw)


def test_aurc_and_update_hist_invalid_arguments_raise():
    logits, labels = _batch(12, b=8)
    with pytest.raises(ValueError, match="csf"):
        aurc(logits, labels, csf="max")
    with pytest.raises(ValueError, match="decay"):
        au_pxtau_update_hist(jnp.zeros(4), logits, decay=1.5)
    with pytest.raises(ValueError, match="hist"):
        au_pxtau_update_hist(jnp.zeros((2, 2)), logits)
