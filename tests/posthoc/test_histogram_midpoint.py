"""Histogram binning with thresholds='midpoint' against uncertainty-calibration 0.1.4."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import posthoc
from calib_jax.posthoc import _histogram

cu = pytest.importorskip("calibration.utils")

M = 10


def _data(n, k, seed):
    rng = np.random.default_rng(seed)
    z = (2.0 * rng.standard_normal((n, k))).astype(np.float32)
    return z, rng.integers(0, k, n).astype(np.int32)


def _floor_f32(x):
    """The largest float32 not above the float64 ``x``."""
    f = np.float32(x)
    return np.nextafter(f, np.float32(-np.inf)) if float(f) > x else f


def _probs(z):
    return np.asarray(jax.nn.softmax(jnp.asarray(z), axis=-1))


@pytest.mark.long
def test_top_label_thresholds_and_values_equal_uncertainty_calibration():
    z, y = _data(1200, 4, seed=0)
    zt, _ = _data(3000, 4, seed=1)
    params = posthoc.fit_histogram_binning(z, y, num_bins=M, thresholds="midpoint")
    p, pt = _probs(z), _probs(zt)
    conf, pred = p.max(axis=1), p.argmax(axis=1)
    conf_t, pred_t = pt.max(axis=1), pt.argmax(axis=1)
    calibrated = np.exp(np.asarray(posthoc.apply_histogram_binning(params, zt)))
    calibrated = calibrated[np.arange(len(pred_t)), pred_t]
    for c in range(4):
        rows = pred == c
        v = [float(x) for x in conf[rows]]
        bins = cu.get_equal_bins(v, num_bins=M)  # ascending, ends with 1.0
        assert len(bins) == M
        want = np.array([_floor_f32(b) for b in bins[:-1]], np.float32)
        np.testing.assert_array_equal(np.asarray(params["thresholds"][c]), want)
        # The calibrated confidence of new rows predicted c: the package's
        # histogram calibrator on the same bins.
        ref = cu.get_histogram_calibrator(v, (y[rows] == c).astype(float), bins)
        new = pred_t == c
        expected = ref(conf_t[new].astype(np.float64))
        np.testing.assert_allclose(calibrated[new], expected, rtol=0, atol=1e-6)


@pytest.mark.long
def test_one_vs_rest_bins_equal_uncertainty_calibration_per_class():
    z, y = _data(800, 3, seed=2)
    zt, _ = _data(2000, 3, seed=3)
    params = posthoc.fit_histogram_binning(
        z, y, num_bins=M, variant="one_vs_rest", thresholds="midpoint"
    )
    p, pt = _probs(z), _probs(zt)
    thr, val = np.asarray(params["thresholds"]), np.asarray(params["values"])
    for c in range(3):
        v = [float(x) for x in p[:, c]]
        bins = cu.get_equal_bins(v, num_bins=M)
        want = np.array([_floor_f32(b) for b in bins[:-1]], np.float32)
        np.testing.assert_array_equal(thr[c], want)
        ref = cu.get_histogram_calibrator(v, (y == c).astype(float), bins)
        ours = val[c][np.searchsorted(thr[c], pt[:, c], side="left")]
        np.testing.assert_allclose(ours, ref(pt[:, c].astype(np.float64)), atol=1e-6)


@pytest.mark.long
def test_validation_rows_keep_their_bins_and_data_stays_the_default():
    z, y = _data(500, 5, seed=4)
    data = posthoc.fit_histogram_binning(z, y, num_bins=M)
    same = posthoc.fit_histogram_binning(z, y, num_bins=M, thresholds="data")
    mid = posthoc.fit_histogram_binning(z, y, num_bins=M, thresholds="midpoint")
    for name in data:
        np.testing.assert_array_equal(data[name], same[name])
    # Same groups of validation rows, so the same bin frequencies; the
    # thresholds move up, to at most the next order statistic.
    np.testing.assert_array_equal(data["values"], mid["values"])
    assert bool(jnp.all(mid["thresholds"] >= data["thresholds"]))
    jitted = jax.jit(
        lambda a, b: posthoc.fit_histogram_binning(
            a, b, num_bins=M, thresholds="midpoint"
        )
    )(z, y)
    for name in mid:
        np.testing.assert_array_equal(jitted[name], mid[name])


def test_floor_midpoint_is_the_largest_float32_not_above_the_exact_midpoint():
    rng = np.random.default_rng(5)
    a = rng.random(4000).astype(np.float32)
    b = a + rng.random(4000).astype(np.float32) * 10.0 ** rng.integers(-7, 0, 4000)
    b = np.maximum(a, b.astype(np.float32))
    # Adjacent floats and equal pairs, where rounding decides.
    b[:500] = np.nextafter(a[:500], np.float32(1.0))
    b[500:600] = a[500:600]
    got = np.asarray(_histogram.floor_midpoint(jnp.asarray(a), jnp.asarray(b)))
    exact = (a.astype(np.float64) + b.astype(np.float64)) / 2  # exact in float64
    assert np.all(got.astype(np.float64) <= exact)
    assert np.all(np.nextafter(got, np.float32(np.inf)).astype(np.float64) > exact)
    assert np.all((got >= a) & (got <= b))
