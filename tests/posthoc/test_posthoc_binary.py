"""Platt scaling and Beta calibration (K = 2)."""

import warnings

import _reference_posthoc as ref
import jax
import numpy as np
import pytest

from calib_jax import posthoc


def binary(n, seed, truth):
    """``[0, d]`` logits, d ~ N(0, 3^2), and labels ~ Bernoulli(truth(s)),
    s = sigmoid(d) the uncalibrated probability of class 1."""
    rng = np.random.default_rng(seed)
    d = (3.0 * rng.standard_normal(n)).astype(np.float32)
    s = ref.sigmoid(d)
    y = (rng.random(n) < truth(s)).astype(np.int32)
    return np.stack([np.zeros(n, np.float32), d], axis=1), y


@pytest.mark.long
@pytest.mark.parametrize("smoothing", [True, False])
def test_platt_matches_float64_reference(smoothing):
    z, y = binary(3000, 0, lambda s: ref.sigmoid(0.4 * np.log(s / (1 - s)) + 0.3))
    params = posthoc.fit_platt(z, y, target_smoothing=smoothing)
    a, b = ref.platt_fit(z, y, smoothing)
    np.testing.assert_allclose([params["a"], params["b"]], [a, b], rtol=1e-4, atol=1e-5)
    zt, _ = binary(500, 1, lambda s: s)
    got = np.exp(np.asarray(posthoc.apply_platt(params, zt), np.float64))
    q = ref.sigmoid(a * (zt[:, 1] - zt[:, 0]) + b)
    np.testing.assert_allclose(got, np.stack([1 - q, q], 1), atol=2e-6)


def test_platt_smoothing_keeps_separable_data_finite():
    d = np.linspace(-3, 3, 200).astype(np.float32)
    z = np.stack([np.zeros_like(d), d], 1)
    y = (d > 0).astype(np.int32)
    params = posthoc.fit_platt(z, y)
    a, b = ref.platt_fit(z, y, True)
    assert np.isfinite(float(params["a"])) and float(params["a"]) > 1.0
    np.testing.assert_allclose([params["a"], params["b"]], [a, b], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    "case, truth",
    [
        ("full", lambda s: s**2 / (s**2 + (1 - s) ** 0.5)),
        ("a<0", lambda s: 1 - s**0.5),  # decreasing in s: refit without ln s
        ("b<0", lambda s: np.minimum(0.3, 2 * s)),  # capped: refit without -ln(1-s)
    ],
)
def test_beta_matches_float64_reference_with_the_refit_rule(case, truth):
    z, y = binary(4000, 2, truth)
    with warnings.catch_warnings():  # 'a<0' predicts below chance on purpose
        warnings.simplefilter("ignore", posthoc.SuspiciousFitWarning)
        params = posthoc.fit_beta(z, y)
    expected = ref.beta_fit(z, y)
    got = np.array([params["a"], params["b"], params["c"]], np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    if case == "a<0":
        assert got[0] == 0.0
    if case == "b<0":
        assert got[1] == 0.0
    if case == "full":
        assert got[0] > 0 and got[1] > 0
    zt, _ = binary(500, 3, lambda s: s)
    out = np.exp(np.asarray(posthoc.apply_beta(params, zt), np.float64))
    q = ref.sigmoid(ref.beta_features(zt) @ expected)
    np.testing.assert_allclose(out, np.stack([1 - q, q], 1), atol=2e-6)


def test_beta_identity_start_and_no_clipping_at_saturated_scores():
    # Logit differences of +-40 saturate s in float32; the features come
    # from log-sigmoids, so the map stays finite.
    z, y = binary(2000, 4, lambda s: s)
    z[:5, 1] = [40.0, -40.0, 60.0, -60.0, 0.0]
    params = posthoc.fit_beta(z, y)
    out = np.asarray(posthoc.apply_beta(params, z))
    assert np.isfinite(out).all()


@pytest.mark.long
@pytest.mark.parametrize("name", ["platt", "beta"])
def test_binary_calibrators_where_jit_and_registry(name):
    z, y = binary(900, 5, lambda s: s**1.5)
    keep = np.arange(900) % 3 != 0
    fit = {"platt": posthoc.fit_platt, "beta": posthoc.fit_beta}[name]
    a = fit(z, y, where=keep)
    b = fit(z[keep], y[keep])
    c = jax.jit(fit)(z[keep], y[keep])
    for key in a:
        # Masked rows change the float32 summation order of the Newton sums.
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(c[key], b[key])
    cal = posthoc.fit(name, z, y)
    assert cal.name == name and name in posthoc.BINARY_ONLY
    np.testing.assert_allclose(np.exp(np.asarray(cal.apply(z))).sum(1), 1.0, atol=1e-6)


@pytest.mark.parametrize("name", ["platt", "beta"])
def test_binary_calibrators_reject_k_other_than_2_in_one_line(name):
    z = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    y = np.arange(50, dtype=np.int32) % 3
    calls = [
        lambda: posthoc.fit(name, z, y),
        lambda: {"platt": posthoc.fit_platt, "beta": posthoc.fit_beta}[name](z, y),
        lambda: {"platt": posthoc.apply_platt, "beta": posthoc.apply_beta}[name](
            {"a": 1.0, "b": 0.0, "c": 0.0}, z
        ),
    ]
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message
        assert (
            f"'{name}' is a binary calibrator: it needs K = 2 classes, got K = 3"
            in message
        )
