"""AU_Pxτ: weights, identities, the loss with a threaded histogram, validation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import (
    ref_au_pxtau,
    ref_au_pxtau_weights,
)
from _selective_helpers import batch as _batch
from _selective_helpers import ce as _ce
from _selective_helpers import scores as _scores

from calib_jax import losses
from calib_jax.losses._au_pxtau import au_pxtau, au_pxtau_weights
from calib_jax.losses._au_pxtau_hist import au_pxtau_update_hist


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


@pytest.mark.long
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
