"""Per-label temperature scaling (calib_jax.posthoc._multilabel) against a
float64 SciPy minimisation of each label's binary cross-entropy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from calib_jax import posthoc

SCALES = np.array([0.5, 1.0, 3.0], np.float32)


def _data(n=600, seed=0, scales=SCALES):
    """Calibrated logits ``g`` (targets drawn from ``sigmoid(g)``) times a known
    factor per label: the population-optimal temperature of label ``l`` is
    ``scales[l]``."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(n, len(scales))) * 1.5 + rng.normal(size=len(scales))
    y = (rng.random(g.shape) < 1.0 / (1.0 + np.exp(-g))).astype(np.int32)
    return (g * scales).astype(np.float32), y


def _bce64(t, z, y):
    """Mean float64 BCE of ``sigmoid(z / t)`` (``logaddexp`` form)."""
    x = np.asarray(z, np.float64) / t
    return float(np.mean(np.logaddexp(0.0, x) - np.asarray(y, np.float64) * x))


def _scipy_temperature(z, y):
    """Float64 1-D minimisation of the BCE over ``log T`` (bounded Brent)."""
    res = optimize.minimize_scalar(
        lambda u: _bce64(math.exp(u), z, y),
        bounds=(math.log(0.01), math.log(100.0)),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return math.exp(res.x)


@pytest.fixture(scope="module")
def fitted():
    z, y = _data()
    return z, y, posthoc.fit_multilabel_temperature(z, y)


def test_each_temperature_equals_a_float64_scipy_minimisation(fitted):
    z, y, cal = fitted
    assert cal.temperatures.shape == (3,) and cal.temperatures.dtype == jnp.float32
    expected = [_scipy_temperature(z[:, k], y[:, k]) for k in range(3)]
    np.testing.assert_allclose(cal.temperatures, expected, rtol=1e-4)


def test_known_scale_per_label_is_recovered(fitted):
    # Population optimum T_l = SCALES[l] (600 rows: a few % sampling noise).
    z, y, cal = fitted
    np.testing.assert_allclose(cal.temperatures, SCALES, rtol=0.15)
    # Exactly equivariant: fitting c * z gives c * T (to the fit's tolerance).
    c = np.array([2.0, 0.25, 5.0], np.float32)
    again = posthoc.fit_multilabel_temperature(z * c, y)
    np.testing.assert_allclose(again.temperatures, cal.temperatures * c, rtol=1e-4)


@pytest.mark.parametrize("seed", [1, 2])
def test_nll_never_increases_against_t_equal_one(seed):
    # Includes an anti-correlated label (negative scale: T -> large) and an
    # under-confident one.
    z, y = _data(seed=seed, scales=np.array([-1.0, 0.3, 4.0], np.float32))
    with pytest.warns(posthoc.SuspiciousFitWarning, match="first: label 0"):
        cal = posthoc.fit_multilabel_temperature(z, y)
    assert float(cal.temperatures[0]) > 20.0
    for k, t in enumerate(np.asarray(cal.temperatures, np.float64)):
        assert t > 0
        assert _bce64(t, z[:, k], y[:, k]) <= _bce64(1.0, z[:, k], y[:, k]) + 1e-7
    assert np.all(cal.aux["nll"] <= cal.aux["nll_at_t1"])
    np.testing.assert_allclose(
        cal.aux["nll_at_t1"],
        [_bce64(1.0, z[:, k], y[:, k]) for k in range(3)],
        rtol=1e-5,
    )


@pytest.mark.long
def test_labels_are_fitted_independently(fitted):
    # One vmapped fit: changing one label's logits leaves the others' alone.
    z, y, cal = fitted
    changed = z.copy()
    changed[:, 1] = changed[:, 1] * 4.0
    again = np.asarray(posthoc.fit_multilabel_temperature(changed, y).temperatures)
    before = np.asarray(cal.temperatures)
    np.testing.assert_allclose(again[[0, 2]], before[[0, 2]], rtol=1e-6)
    np.testing.assert_allclose(again[1], 4.0 * before[1], rtol=1e-4)


def test_where_equals_slicing_under_jit(fitted):
    # The jitted fit of padded rows (NaN/inf logits, label 7) with a mask
    # equals the eager fit of the sliced rows.
    z, y, cal = fitted
    pad_z = np.concatenate([z, np.full((5, 3), np.inf, np.float32)])
    pad_z[-1, 0] = np.nan
    pad_y = np.concatenate([y, np.full((5, 3), 7, np.int32)])
    where = np.arange(605) < 600
    fit = jax.jit(lambda a, b, w: posthoc.fit_multilabel_temperature(a, b, where=w))
    jitted = fit(jnp.asarray(pad_z), jnp.asarray(pad_y), jnp.asarray(where))
    np.testing.assert_allclose(jitted.temperatures, cal.temperatures, rtol=1e-6)


def test_apply_probs_summary_and_save_load_round_trip(fitted, tmp_path):
    z, _, cal = fitted
    np.testing.assert_allclose(
        cal.apply(z), z / np.asarray(cal.temperatures), rtol=1e-6
    )
    np.testing.assert_allclose(
        cal.probs(z), 1.0 / (1.0 + np.exp(-z / np.asarray(cal.temperatures))), rtol=1e-5
    )
    summary = cal.summary()
    assert summary["temperatures"] == [float(t) for t in cal.temperatures]
    assert set(summary) == {"temperatures", "nll", "nll_at_t1", "num_iter"}
    path = tmp_path / "ml.npz"
    cal.save(path)
    back = posthoc.MultilabelTemperature.load(path)
    np.testing.assert_array_equal(back.temperatures, cal.temperatures)
    assert back.name == cal.name == "ts:multilabel"
    assert bool(jnp.all(back.apply(z) == cal.apply(z)))
    with pytest.raises(ValueError, match="already exists"):
        cal.save(path)
    with pytest.raises(ValueError, match="expected 'calib_jax.posthoc.Calibrator'"):
        posthoc.load(path)
    with pytest.raises(ValueError, match="temperatures must have shape"):
        cal.apply(z[:, :2])


def test_bad_targets_are_one_line_errors():
    z, y = _data(n=20)
    wide = y.astype(np.int64)
    wide[2, 2] = 2**32
    with pytest.raises(ValueError, match=r"found 4294967296 at row 2, label 2"):
        posthoc.fit_multilabel_temperature(z, wide)
    with pytest.raises(ValueError, match=r"labels must have the shape of logits"):
        posthoc.fit_multilabel_temperature(z, y[:, 0])
    with pytest.raises(ValueError, match=r"found 0.5 at row 1, label 0"):
        posthoc.fit_multilabel_temperature(
            z, np.where(np.arange(20)[:, None] == 1, 0.5, y)
        )
