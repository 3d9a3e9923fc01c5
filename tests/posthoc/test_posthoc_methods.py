"""ETS, PTS, CTS, vector/matrix scaling and Dirichlet/ODIR calibration."""

import _reference_posthoc as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import posthoc


@pytest.fixture(scope="module")
def data():
    # (2000, 10) like the temperature tests, so compiled fits are shared.
    z, y = overconfident(2000, 10, seed=3)
    zt, yt = overconfident(2000, 10, seed=4)
    return z, y, zt, yt


@pytest.mark.long
@pytest.mark.parametrize("name", ["ts", "ets", "pts"])
def test_accuracy_preserving_methods_keep_the_argmax(data, name):
    z, y, zt, _ = data
    cal = posthoc.fit(name, z, y)
    np.testing.assert_array_equal(
        np.argmax(cal.apply(zt), axis=1), np.argmax(zt, axis=1)
    )
    assert name in posthoc.ACCURACY_PRESERVING


def test_cts_vector_matrix_dirichlet_can_change_the_argmax():
    z = jnp.array([[2.0, 1.0]])
    assert (
        int(jnp.argmax(posthoc.apply_cts({"temperatures": jnp.array([2.0, 0.25])}, z)))
        == 1
    )
    vec = {"w": jnp.array([1.0, 1.0]), "b": jnp.array([0.0, 2.0])}
    assert int(jnp.argmax(posthoc.apply_vector_scaling(vec, z))) == 1
    mat = {"W": jnp.array([[0.0, 1.0], [1.0, 0.0]]), "b": jnp.zeros(2)}
    assert int(jnp.argmax(posthoc.apply_matrix_scaling(mat, z))) == 1
    assert int(jnp.argmax(posthoc.apply_dirichlet(mat, z))) == 1
    for name in ("cts", "vector", "matrix", "dirichlet"):
        assert name not in posthoc.ACCURACY_PRESERVING


def test_ets_original_matches_slsqp_reference(data):
    z, y, _, _ = data
    params = posthoc.fit_ets_params(z, y)
    t = float(params["temperature"])
    np.testing.assert_allclose(t, ref.ts_nll_optimum_scipy(z, y), rtol=1e-4)
    w = np.asarray(params["weights"], np.float64)
    assert w.min() >= 0 and abs(w.sum() - 1.0) < 1e-6
    w_ref = ref.ets_weights_slsqp(z, y, t)
    ours = ref.ets_original_nll(z, y, t, w)
    theirs = ref.ets_original_nll(z, y, t, w_ref)
    assert ours <= theirs + 1e-6
    # apply_ets returns log-probabilities of the mixture.
    mix = np.exp(np.asarray(posthoc.apply_ets(params, z), np.float64))
    expected = w[0] * ref.softmax(z / t) + w[1] * ref.softmax(z) + w[2] / z.shape[1]
    np.testing.assert_allclose(mix, expected, rtol=1e-4, atol=1e-7)


def test_ets_logit_form_is_ts_with_effective_temperature(data):
    z, y, _, _ = data
    params = posthoc.fit_ets_params(z, y, form="logit")
    w, t = np.asarray(params["weights"]), float(params["temperature"])
    t_eff = 1.0 / (w[0] / t + w[1])
    out = posthoc.apply_ets(params, z, form="logit")
    np.testing.assert_allclose(
        jax.nn.log_softmax(out), jax.nn.log_softmax(z / t_eff), atol=2e-5
    )
    # The logit form cannot beat the best single temperature on the fit set.
    best = ref.nll(z, y, ref.ts_nll_optimum_scipy(z, y))
    assert ref.nll(z, y, t_eff) == pytest.approx(best, abs=1e-5)


def test_pts_trains_below_identity_towards_the_true_temperature(data):
    z, y, zt, yt = data
    params = posthoc.fit_pts(z, y, steps=300, seed=1)
    t = posthoc._pts.sample_temperatures(params, jnp.asarray(zt))
    assert 2.5 < float(jnp.median(t)) < 3.5
    calibrated = ref.nll(np.asarray(posthoc.apply_pts(params, zt)), yt)
    assert calibrated < ref.nll(zt, yt) - 0.2
    assert calibrated < ref.nll(zt, yt, ref.ts_nll_optimum_scipy(z, y)) + 0.02
    # A different seed gives a different network (the init is seeded).
    other = posthoc.fit_pts(z, y, steps=300, seed=2)
    assert not np.allclose(other[0][0], params[0][0])


def test_cts_lowers_nll_and_matches_per_class_optimality(data):
    z, y, _, _ = data
    params = posthoc.fit_cts(z, y)
    temps = np.asarray(params["temperatures"], np.float64)
    base = ref.nll(z / temps[None, :], y)
    assert base < ref.nll(z, y, ref.ts_nll_optimum_scipy(z, y)) + 1e-6
    # Stationarity: moving any single temperature by 1% does not help.
    for k in range(z.shape[1]):
        for f in (0.99, 1.01):
            t2 = temps.copy()
            t2[k] *= f
            assert ref.nll(z / t2[None, :], y) >= base - 1e-7


@pytest.mark.long
def test_vector_and_matrix_scaling_beat_ts_on_the_fit_set(data):
    z, y, _, _ = data
    ts = ref.nll(z, y, ref.ts_nll_optimum_scipy(z, y))
    vec = posthoc.fit_vector_scaling(z, y)
    mat = posthoc.fit_matrix_scaling(z, y)
    nll_vec = ref.nll(np.asarray(posthoc.apply_vector_scaling(vec, z)), y)
    nll_mat = ref.nll(np.asarray(posthoc.apply_matrix_scaling(mat, z)), y)
    assert nll_vec <= ts + 1e-6
    assert nll_mat <= nll_vec + 1e-6


@pytest.mark.long
def test_dirichlet_odir_objective_and_fit_match_scipy():
    z, y = overconfident(600, 3, seed=5)
    lam, mu = 0.05, 0.02
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(3, 3)), rng.normal(size=3)
    from calib_jax.posthoc._dirichlet import dirichlet_objective

    ours = dirichlet_objective(
        {"W": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)},
        jnp.asarray(z),
        jnp.asarray(y),
        jnp.full((600,), 1 / 600, jnp.float32),
        lam,
        mu,
    )
    np.testing.assert_allclose(
        ours, ref.dirichlet_odir_objective(w, b, z, y, lam, mu), rtol=1e-5
    )
    params = posthoc.fit_dirichlet(z, y, off_diagonal=lam, intercept=mu)
    w_ref, b_ref, f_ref = ref.dirichlet_odir_fit_scipy(z, y, lam, mu)
    f_ours = ref.dirichlet_odir_objective(
        np.asarray(params["W"], np.float64), np.asarray(params["b"]), z, y, lam, mu
    )
    assert f_ours <= f_ref + 1e-6
    np.testing.assert_allclose(params["W"], w_ref, atol=2e-3)
    np.testing.assert_allclose(params["b"], b_ref, atol=2e-3)
