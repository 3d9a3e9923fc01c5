"""Bootstrap percentile intervals: NumPy replay, coverage, degenerate data."""

from __future__ import annotations

import functools
import math

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics._cases import padded, softmax_case

from calib_jax import metrics

KEY = jax.random.key(7)


def _replay(fn_ref, probs, labels, num_samples, key, n_rows=None):
    """The float64 reference metric on the resamples the library draws."""
    n = len(labels)
    draw = jax.vmap(lambda b: metrics.resample_indices(key, b, n_rows or n, n))
    indices = np.asarray(draw(jnp.arange(num_samples)))[:, :n]
    return np.asarray([fn_ref(probs[idx], labels[idx]) for idx in indices])


@pytest.mark.long
@pytest.mark.parametrize(
    "name, fn_ref",
    [("accuracy", ref.accuracy), ("brier", ref.brier), ("ece", ref.ece)],
)
def test_equals_numpy_bootstrap_on_the_same_resamples(name, fn_ref):
    probs, labels = softmax_case(n=60, k=4, seed=51)
    res = metrics.bootstrap(
        name, probs, labels, num_samples=50, key=KEY, confidence=0.9
    )
    values = _replay(fn_ref, probs, labels, 50, KEY)
    np.testing.assert_allclose(np.asarray(res.samples), values, rtol=1e-5, atol=1e-6)
    # The interval is NumPy's percentile interval of the resampled values.
    lo, hi = ref.percentile_interval(np.asarray(res.samples), 0.9)
    np.testing.assert_allclose(
        [float(res.lower), float(res.upper)], [lo, hi], rtol=1e-6
    )
    lo, hi = ref.percentile_interval(values, 0.9)
    np.testing.assert_allclose(
        [float(res.lower), float(res.upper)], [lo, hi], rtol=1e-5
    )
    np.testing.assert_allclose(float(res.estimate), fn_ref(probs, labels), rtol=1e-5)


@pytest.mark.long
def test_where_equals_slicing_and_jit_equals_eager():
    probs, labels = softmax_case(n=50, k=3, seed=52)
    pp, pl, w = padded(probs, labels, size=64)
    fn = functools.partial(metrics.ece, num_bins=5)
    sliced = metrics.bootstrap(fn, probs, labels, num_samples=40, key=KEY)
    masked = metrics.bootstrap(fn, pp, pl, num_samples=40, key=KEY, where=w)
    # Resample b draws the same rows: randint's draws are prefix-consistent.
    np.testing.assert_allclose(
        np.asarray(masked.samples), np.asarray(sliced.samples), rtol=1e-6
    )
    run = jax.jit(lambda p, y, k: metrics.bootstrap(fn, p, y, num_samples=40, key=k))
    jitted = run(probs, labels, KEY)
    for a, b in zip(jitted, sliced):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


@pytest.mark.long
def test_several_metrics_share_the_resamples():
    probs, labels = softmax_case(n=40, k=3, seed=53)
    both = metrics.bootstrap(
        {"acc": "accuracy", "nll": metrics.nll}, probs, labels, num_samples=30, key=KEY
    )
    values = _replay(ref.nll, probs, labels, 30, KEY)
    np.testing.assert_allclose(np.asarray(both.samples["nll"]), values, rtol=1e-5)
    # One metric alone, in blocks of 7 resamples under lax.map (30 = 5 blocks
    # of 6 after balancing), draws the same resamples as the pair in one vmap.
    one = metrics.bootstrap(
        metrics.accuracy, probs, labels, num_samples=30, key=KEY, block_size=7
    )
    np.testing.assert_array_equal(
        np.asarray(both.samples["acc"]), np.asarray(one.samples)
    )
    assert float(both.upper["acc"]) == float(one.upper)
    values = _replay(ref.accuracy, probs, labels, 30, KEY)
    np.testing.assert_allclose(np.asarray(one.samples), values, rtol=1e-6)


def test_degenerate_data_gives_zero_width():
    probs = np.tile(np.float32([[0.7, 0.2, 0.1]]), (30, 1))
    labels = np.zeros(30, np.int32)
    res = metrics.bootstrap(
        {"acc": "accuracy", "ece": "ece", "smece": "smooth_ece"},
        probs,
        labels,
        num_samples=20,
        key=KEY,
    )
    for name in ("acc", "ece", "smece"):
        assert (
            float(res.lower[name])
            == float(res.upper[name])
            == float(res.estimate[name])
        )
    assert float(res.estimate["ece"]) == pytest.approx(0.3, abs=1e-6)


@pytest.mark.long
def test_interval_covers_the_truth_at_the_nominal_rate():
    # 300 data sets of 200 Bernoulli(0.8) outcomes; accuracy's true value is
    # 0.8. The 95% percentile interval should contain it in about 95% of the
    # data sets: accept within 3 binomial standard errors (plus 0.01 for the
    # known undercoverage of percentile intervals at this n).
    reps, n, p_true, level = 300, 200, 0.8, 0.95
    rng = np.random.default_rng(54)
    correct = rng.random((reps, n)) < p_true
    probs = np.broadcast_to(np.float32([0.9, 0.1]), (reps, n, 2))
    labels = np.where(correct, 0, 1).astype(np.int32)
    keys = jax.random.split(jax.random.key(55), reps)

    @jax.jit
    @jax.vmap
    def interval(p, y, k):
        res = metrics.bootstrap(metrics.accuracy, p, y, num_samples=200, key=k)
        return res.lower, res.upper

    lower, upper = (np.asarray(v) for v in interval(jnp.asarray(probs), labels, keys))
    rate = np.mean((lower <= p_true) & (p_true <= upper))
    se = math.sqrt(level * (1 - level) / reps)
    assert level - 3 * se - 0.01 <= rate <= level + 3 * se, rate


def test_bad_arguments():
    probs, labels = softmax_case(n=20, k=3, seed=56)
    with pytest.raises(ValueError, match="num_samples"):
        metrics.bootstrap("ece", probs, labels, num_samples=0, key=KEY)
    with pytest.raises(ValueError, match="confidence must lie in"):
        metrics.bootstrap("ece", probs, labels, num_samples=10, key=KEY, confidence=1.0)
    with pytest.raises(ValueError, match="key must be"):
        metrics.bootstrap("ece", probs, labels, num_samples=10, key=3)
    with pytest.raises(ValueError, match="known metrics"):
        metrics.bootstrap("ece2", probs, labels, num_samples=10, key=KEY)
    with pytest.raises(ValueError, match="scores_in"):
        metrics.bootstrap("ood_auroc", probs, labels, num_samples=10, key=KEY)
    with pytest.raises(ValueError, match="returning a scalar"):
        metrics.bootstrap("reliability_bins", probs, labels, num_samples=10, key=KEY)
    with pytest.raises(TypeError, match="callable"):
        metrics.bootstrap({"a": 3}, probs, labels, num_samples=10, key=KEY)
    with pytest.raises(ValueError, match="block_size"):
        metrics.bootstrap("ece", probs, labels, num_samples=10, key=KEY, block_size=0)
    with pytest.raises(ValueError, match="sum to 1"):
        metrics.bootstrap("ece", probs * 0.5, labels, num_samples=10, key=KEY)
