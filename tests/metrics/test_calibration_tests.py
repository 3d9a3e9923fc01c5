"""Spiegelhalter's Z test and the ECE consistency-resampling test.

References: float64 NumPy formulas written here, MAPIE's
``spiegelhalter_statistic`` / ``spiegelhalter_p_value`` (one-sided; ours is
two-sided), ``metrics.ece`` for the observed ECE, and a float64 ECE of the
surrogate datasets rebuilt from the documented draws.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from metrics._cases import softmax_case
from scipy import stats

from calib_jax import metrics
from calib_jax.metrics import _calibration_tests


def _forecasts64(probs, labels, mode):
    p = np.asarray(probs, np.float64)
    if mode == "binary":
        return p[:, 1], (np.asarray(labels) == 1).astype(np.float64)
    return p.max(axis=1), (p.argmax(axis=1) == labels).astype(np.float64)


def _spiegelhalter64(x, o):
    num = np.sum((o - x) * (1 - 2 * x))
    den = np.sqrt(np.sum((1 - 2 * x) ** 2 * x * (1 - x)))
    z = num / den
    return z, 2 * stats.norm.sf(abs(z))


def _binary_case(n=400, seed=0, shift=0.0):
    """K = 2 rows [1 - p, p] with labels ~ Bernoulli(clip(p + shift))."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n).astype(np.float32)
    y = rng.uniform(size=n) < np.clip(p + shift, 0, 1)
    return np.stack([1 - p, p], axis=1), y.astype(np.int32)


# ---------------------------------------------------------------------------
# Spiegelhalter
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["top_label", "binary"])
def test_spiegelhalter_matches_the_float64_formula(mode):
    if mode == "binary":
        probs, labels = _binary_case(seed=1, shift=0.05)
    else:
        probs, labels = softmax_case(n=500, k=10, seed=3)
    z, p = metrics.spiegelhalter_test(probs, labels, mode=mode)
    z64, p64 = _spiegelhalter64(*_forecasts64(probs, labels, mode))
    assert z.dtype == p.dtype == jnp.float32
    np.testing.assert_allclose(float(z), z64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(p), p64, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["top_label", "binary"])
def test_spiegelhalter_matches_mapie(mode):
    from mapie.metrics.calibration import (
        spiegelhalter_p_value,
        spiegelhalter_statistic,
    )

    probs, labels = (
        _binary_case(seed=2, shift=-0.04)
        if mode == "binary"
        else softmax_case(n=300, k=5, seed=4)
    )
    x, o = _forecasts64(probs, labels, mode)
    z, p = metrics.spiegelhalter_test(probs, labels, mode=mode)
    np.testing.assert_allclose(
        float(z), spiegelhalter_statistic(o, x), rtol=1e-5, atol=1e-5
    )
    one_sided = spiegelhalter_p_value(o, x)  # 1 - Phi(Z)
    np.testing.assert_allclose(
        float(p), 2 * min(one_sided, 1 - one_sided), rtol=1e-4, atol=1e-6
    )


def test_spiegelhalter_rejects_miscalibration_and_keeps_calibration():
    probs, labels = _binary_case(n=4000, seed=5)
    assert float(metrics.spiegelhalter_test(probs, labels, mode="binary")[1]) > 0.01
    # Overconfident: the forecasts pushed away from 1/2.
    p = probs[:, 1]
    sharp = np.clip(0.5 + 1.6 * (p - 0.5), 0.01, 0.99).astype(np.float32)
    bad = np.stack([1 - sharp, sharp], axis=1)
    z, pv = metrics.spiegelhalter_test(bad, labels, mode="binary")
    assert float(pv) < 1e-6 and float(z) > 0
    # Underconfident: pulled towards 1/2.
    flat = (0.5 + 0.5 * (p - 0.5)).astype(np.float32)
    z, pv = metrics.spiegelhalter_test(
        np.stack([1 - flat, flat], axis=1), labels, mode="binary"
    )
    assert float(pv) < 1e-6 and float(z) < 0


def test_spiegelhalter_degenerate_denominator():
    certain = np.float32([[1, 0], [0, 1], [0, 1], [1, 0]])
    right = np.int32([0, 1, 1, 0])
    z, p = metrics.spiegelhalter_test(certain, right, mode="binary")
    assert (float(z), float(p)) == (0.0, 1.0)
    # A forecast of probability 1 for class 1 with label 0: (0 - 1)(1 - 2) > 0.
    z, p = metrics.spiegelhalter_test(certain, np.int32([0, 0, 1, 0]), mode="binary")
    assert (float(z), float(p)) == (np.inf, 0.0)
    # Its mirror: probability 0 for class 1 with label 1, (1 - 0)(1 - 0) > 0.
    z, p = metrics.spiegelhalter_test(certain, np.int32([1, 1, 1, 0]), mode="binary")
    assert (float(z), float(p)) == (np.inf, 0.0)
    # All forecasts 1/2: no weight at all.
    half = np.full((4, 2), 0.5, np.float32)
    z, p = metrics.spiegelhalter_test(half, right, mode="binary")
    assert (float(z), float(p)) == (0.0, 1.0)
    # Top label: a confidence of 1.0 that is wrong, (0 - 1)(1 - 2) > 0.
    z, p = metrics.spiegelhalter_test(certain, np.int32([1, 1, 1, 0]))
    assert (float(z), float(p)) == (np.inf, 0.0)


@pytest.mark.long
def test_spiegelhalter_stats_merge_equals_one_shot_and_where_equals_slicing():
    probs, labels = softmax_case(n=600, k=6, seed=6)
    whole = metrics.spiegelhalter_test(probs, labels)
    stats_ = metrics.SpiegelhalterStats.empty()
    for lo in range(0, 600, 128):
        stats_ = stats_ + metrics.SpiegelhalterStats.from_batch(
            probs[lo : lo + 128], labels[lo : lo + 128]
        )
    assert int(stats_.total) == 600
    np.testing.assert_allclose(stats_.compute(), whole, rtol=1e-5, atol=1e-6)
    keep = np.random.default_rng(0).uniform(size=600) < 0.6
    for mode, (pr, lb) in {
        "top_label": (probs, labels),
        "binary": _binary_case(n=600, seed=7),
    }.items():
        masked = metrics.spiegelhalter_test(pr, lb, mode=mode, where=keep)
        sliced = metrics.spiegelhalter_test(pr[keep], lb[keep], mode=mode)
        np.testing.assert_allclose(masked, sliced, rtol=1e-5, atol=1e-6)


def test_spiegelhalter_jit_sharded_and_bf16():
    assert jax.device_count() == 8
    probs, labels = softmax_case(n=1024, k=10, seed=8)
    eager = metrics.spiegelhalter_test(probs, labels)
    f = jax.jit(lambda p, y: metrics.spiegelhalter_test(p, y))
    np.testing.assert_allclose(f(probs, labels), eager, rtol=1e-5, atol=1e-6)
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    sharded = f(jax.device_put(probs, rows), jax.device_put(labels, rows))
    np.testing.assert_allclose(sharded, eager, rtol=1e-5, atol=1e-6)
    half = jnp.asarray(probs, jnp.bfloat16)
    z, p = metrics.spiegelhalter_test(half, labels)
    assert z.dtype == p.dtype == jnp.float32
    z64, _ = _spiegelhalter64(
        *_forecasts64(np.asarray(half, np.float64), labels, "top_label")
    )
    np.testing.assert_allclose(float(z), z64, rtol=1e-4, atol=1e-4)


def test_spiegelhalter_options_are_checked():
    probs, labels = softmax_case(n=16, k=3, seed=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        metrics.spiegelhalter_test(probs, labels, mode="multiclass")
    with pytest.raises(ValueError, match="K = 2 columns"):
        metrics.spiegelhalter_test(probs, labels, mode="binary")


# ---------------------------------------------------------------------------
# Consistency resampling
# ---------------------------------------------------------------------------


def _ece64(conf, correct, num_bins):
    """Equal-width ECE, bins [k/M, (k+1)/M), 1.0 in the last bin (float64)."""
    b = np.minimum(np.floor(conf * num_bins).astype(int), num_bins - 1)
    gap = np.bincount(b, weights=conf - correct, minlength=num_bins)
    return np.sum(np.abs(gap)) / conf.size


_draws = jax.jit(_calibration_tests.consistency_draws, static_argnums=(3, 4))


@pytest.mark.long
def test_consistency_statistic_is_the_ece():
    probs, labels = softmax_case(n=300, k=10, seed=9)
    keep = np.arange(300) % 3 != 0
    for num_bins, where in [(15, None), (10, keep)]:
        t = metrics.ece_consistency_test(
            probs,
            labels,
            key=jax.random.key(0),
            num_samples=20,
            num_bins=num_bins,
            where=where,
        )
        ref = metrics.ece(probs, labels, num_bins=num_bins, where=where)
        np.testing.assert_allclose(float(t.statistic), float(ref), atol=1e-6)
        assert t.statistic.dtype == t.p_value.dtype == jnp.float32


def test_consistency_draws_match_a_float64_rebuild_of_the_surrogates():
    # The documented recipe: draw s uses split(key, S)[s], split again into
    # (rows, outcome); rows uniform over the included rows, outcome
    # uniform < confidence.
    probs, _ = softmax_case(n=200, k=4, seed=10)
    keep = np.arange(200) % 4 != 1
    conf = probs.max(axis=1)
    key, num_samples, num_bins = jax.random.key(3), 6, 10
    draws = _draws(jnp.asarray(conf), jnp.asarray(keep), key, num_samples, num_bins)
    included = np.flatnonzero(keep)
    for s, k in enumerate(jax.random.split(key, num_samples)):
        k_rows, k_outcome = jax.random.split(k)
        idx = included[np.asarray(jax.random.randint(k_rows, (200,), 0, keep.sum()))]
        u = np.asarray(jax.random.uniform(k_outcome, (200,), jnp.float32))
        c = conf[idx]
        outcome = (u < c)[keep]
        ref = _ece64(c[keep].astype(np.float64), outcome.astype(np.float64), num_bins)
        np.testing.assert_allclose(float(draws[s]), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.long
def test_consistency_p_value_rule_determinism_and_jit():
    probs, labels = softmax_case(n=400, k=10, seed=11)
    key = jax.random.key(7)
    t = metrics.ece_consistency_test(probs, labels, key=key, num_samples=50)
    again = metrics.ece_consistency_test(probs, labels, key=key, num_samples=50)
    assert float(t.p_value) == float(again.p_value)
    f = jax.jit(
        lambda p, y, k: metrics.ece_consistency_test(p, y, key=k, num_samples=50)
    )
    np.testing.assert_allclose(f(probs, labels, key), t, rtol=1e-6)
    # The +1 rule: p = (1 + #{draws >= observed}) / (1 + S), from the draws.
    conf = jnp.asarray(probs.max(axis=1))
    draws = _draws(conf, jnp.ones(400, bool), key, 50, 15)
    expected = (1 + int(np.sum(np.asarray(draws) >= float(t.statistic)))) / 51
    np.testing.assert_allclose(float(t.p_value), expected, rtol=1e-6)
    # A raw uint32 key is accepted too.
    assert _calibration_tests._check_key(jax.random.PRNGKey(7)).shape == (2,)


def _calibrated(key, n=400, k=5):
    """Rows whose top-label confidence c is calibrated: correct ~ Bernoulli(c)."""
    k_conf, k_correct, k_label = jax.random.split(key, 3)
    c = jax.random.uniform(k_conf, (n,), minval=1.0 / k + 0.05, maxval=1.0)
    rest = (1.0 - c) / (k - 1)
    probs = jnp.concatenate(
        [c[:, None], jnp.broadcast_to(rest[:, None], (n, k - 1))], axis=1
    )
    correct = jax.random.uniform(k_correct, (n,)) < c
    wrong = jax.random.randint(k_label, (n,), 1, k)
    return probs, jnp.where(correct, 0, wrong).astype(jnp.int32)


@pytest.mark.long
def test_consistency_p_values_are_roughly_uniform_under_calibration():
    keys = jax.random.split(jax.random.key(2026), 20)

    def one(k):
        k_data, k_test = jax.random.split(k)
        probs, labels = _calibrated(k_data)
        return metrics.ece_consistency_test(
            probs, labels, key=k_test, num_samples=200
        ).p_value

    p = np.asarray(jax.jit(jax.vmap(one))(keys))
    assert stats.kstest(p, "uniform").pvalue > 0.01, p
    assert np.sum(p < 0.05) <= 4, p
    assert np.median(p) > 0.2, p


@pytest.mark.long
def test_consistency_p_value_is_minimal_on_miscalibrated_data():
    probs, labels = _calibrated(jax.random.key(1))
    # Confident and right half the time.
    k = probs.shape[1]
    bad = jnp.full((400, k), 0.04 / (k - 1)).at[:, 0].set(0.96)
    labels = jnp.where(jnp.arange(400) % 2 == 0, 0, labels.clip(1))
    t = metrics.ece_consistency_test(bad, labels, key=jax.random.key(0), num_samples=99)
    assert float(t.p_value) == pytest.approx(1 / 100)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_samples": 0}, "num_samples must be >= 1, got 0"),
        ({"num_samples": 2.5}, "num_samples must be a Python int >= 1"),
        ({"num_bins": 0}, "num_bins must be >= 1"),
        ({"key": np.float32([1, 2])}, "key must be one PRNG key"),
    ],
)
def test_consistency_options_are_checked(kwargs, message):
    probs, labels = softmax_case(n=16, k=3, seed=0)
    kwargs = {"key": jax.random.key(0), **kwargs}
    with pytest.raises(ValueError, match=message):
        metrics.ece_consistency_test(probs, labels, **kwargs)


@pytest.mark.long
def test_bad_values_are_rejected_eagerly():
    probs, labels = softmax_case(n=16, k=3, seed=0)
    probs[5, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\)"):
        metrics.spiegelhalter_test(probs, labels)
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\)"):
        metrics.ece_consistency_test(probs, labels, key=jax.random.key(0))
    with pytest.raises(ValueError, match="where excludes every row"):
        metrics.spiegelhalter_test(probs, labels, where=np.zeros(16, bool))
    # A NumPy integer count is a count.
    ok = metrics.ece_consistency_test(
        probs[:4], labels[:4], key=jax.random.key(0), num_samples=np.int64(9)
    )
    assert float(ok.p_value) * 10 == pytest.approx(round(float(ok.p_value) * 10))
