"""Smooth ECE and its reliability curve against the float64 definition."""

from __future__ import annotations

import itertools

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from metrics._cases import all_cases, binary_case, padded, softmax_case

from calib_jax import metrics

CASES = all_cases()
# The reference integrates the exact reflected kernel on 2001 points; the
# metric rounds the predictions to its 8193-point grid. Both errors are
# O((h / sigma)^2) and far below this for the scales reached here.
TOL = {"rtol": 2e-5, "atol": 1e-6}
REF_POINTS = 2001


def calibrated_case(n=240, seed=5):
    """Binary predictions f ~ U(0.55, 1) with outcomes ~ Bernoulli(f): small sigma*."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.55, 1.0, n).astype(np.float32)
    return binary_case(f, rng.random(n) < f)


@pytest.mark.long
@pytest.mark.parametrize("case", ["ties", "edges", "n1", "empty_bins", "calibrated"])
def test_fixed_point_matches_reference(case):
    probs, labels = calibrated_case() if case == "calibrated" else CASES[case]
    pp, pl, w = padded(probs, labels)
    expected, sigma = ref.smooth_ece(probs, labels, points=REF_POINTS)
    curve = metrics.smooth_reliability(pp, pl, where=w)
    np.testing.assert_allclose(float(curve["smece"]), expected, **TOL)
    np.testing.assert_allclose(float(curve["bandwidth"]), sigma, **TOL)
    # The returned value sits at the fixed point smECE(sigma*) = sigma*.
    np.testing.assert_allclose(float(curve["smece"]), float(curve["bandwidth"]), 1e-5)
    value = metrics.smooth_ece(pp, pl, where=w)
    assert float(value) == float(curve["smece"])


@pytest.mark.parametrize("sigma", [0.01, 0.05, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("target", ["top_label", "binary"])
def test_fixed_bandwidth_matches_reference(sigma, target):
    probs, labels = softmax_case(n=120, k=2, seed=8)
    expected, _ = ref.smooth_ece(probs, labels, sigma, target, points=REF_POINTS)
    got = metrics.smooth_ece(probs, labels, bandwidth=sigma, target=target)
    np.testing.assert_allclose(float(got), expected, **TOL)


def test_top_label_of_many_classes_matches_reference():
    probs, labels = softmax_case(n=150, k=10, seed=9, boost=3.0)
    expected, _ = ref.smooth_ece(probs, labels, points=REF_POINTS)
    np.testing.assert_allclose(
        float(metrics.smooth_ece(probs, labels)), expected, **TOL
    )


def test_non_increasing_in_bandwidth_and_grid_converged():
    probs, labels = calibrated_case(n=500, seed=11)
    sigmas = [0.002, 0.005, 0.01, 0.03, 0.1, 0.3, 1.0]
    values = [float(metrics.smooth_ece(probs, labels, bandwidth=s)) for s in sigmas]
    assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(values)), values
    # A 4x coarser grid changes the fixed-point value by O((h / sigma)^2).
    fine = float(metrics.smooth_ece(probs, labels))
    coarse = float(metrics.smooth_ece(probs, labels, num_points=2049))
    np.testing.assert_allclose(coarse, fine, rtol=1e-4)


def test_reliability_curve_encodes_the_smooth_ece():
    probs, labels = softmax_case(n=400, k=10, seed=12, boost=3.0)
    curve = {
        k: np.asarray(v, np.float64)
        for k, v in metrics.smooth_reliability(probs, labels).items()
    }
    t, acc, dens = curve["grid"], curve["accuracy"], curve["density"]
    h = t[1] - t[0]
    np.testing.assert_allclose(t, np.linspace(0, 1, 8193), atol=1e-7)

    def trapezoid(v):
        return h * (v.sum() - 0.5 * (v[0] + v[-1]))

    assert trapezoid(dens) == pytest.approx(1.0, abs=1e-5)
    gap = np.where(np.isnan(acc), 0.0, np.abs(acc - t) * dens)
    assert trapezoid(gap) == pytest.approx(float(curve["smece"]), abs=2e-6)
    # Undefined only far from every prediction (confidences are >= 0.1 here).
    assert not np.isnan(acc[t >= 0.5]).any()


def test_perfect_predictions_give_zero():
    probs = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 1]]
    labels = np.int32([0, 1, 2, 3, 1])
    curve = metrics.smooth_reliability(probs, labels)
    assert float(curve["smece"]) == 0.0
    assert float(curve["bandwidth"]) == pytest.approx(1e-3, rel=1e-6)  # the floor


@pytest.mark.long
def test_jit_where_bf16_and_sharding():
    probs, labels = softmax_case(n=64, k=5, seed=13)
    eager = float(metrics.smooth_ece(probs, labels))
    jitted = jax.jit(metrics.smooth_ece, static_argnames=("target", "num_points"))
    np.testing.assert_allclose(float(jitted(probs, labels)), eager, rtol=1e-6)
    pp, pl, w = padded(probs, labels, size=96)
    np.testing.assert_allclose(
        float(metrics.smooth_ece(pp, pl, where=w)), eager, rtol=1e-6
    )
    out = metrics.smooth_ece(jnp.asarray(probs, jnp.bfloat16), labels)
    assert out.dtype == jnp.float32
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    sharded = jax.jit(metrics.smooth_ece)(
        jax.device_put(pp, rows),
        jax.device_put(pl, rows),
        where=jax.device_put(w, rows),
    )
    np.testing.assert_allclose(float(sharded), eager, rtol=1e-6)


def test_bad_options():
    probs, labels = softmax_case(n=20, k=3, seed=14)
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="bandwidth must be None"):
            metrics.smooth_ece(probs, labels, bandwidth=bad)
    with pytest.raises(ValueError, match="bandwidth must be a scalar"):
        metrics.smooth_ece(probs, labels, bandwidth=np.ones(2))
    with pytest.raises(ValueError, match="target must be one of"):
        metrics.smooth_ece(probs, labels, target="classwise")
    with pytest.raises(ValueError, match="needs K = 2"):
        metrics.smooth_ece(probs, labels, target="binary")
    with pytest.raises(ValueError, match="num_points"):
        metrics.smooth_ece(probs, labels, num_points=2)
    with pytest.raises(ValueError, match="jax.nn.softmax"):
        metrics.smooth_ece(np.log(probs), labels)
