"""Both formulations of the temperature-scaling kernels (family
'posthoc_temperature'): the row-blocked exp sums with fused derivatives in
log T, and the plain one-pass sums differentiated by JAX."""

import _reference_posthoc as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import kernels, posthoc
from calib_jax.posthoc import _cpu_kernels, _temperature

MODES = ("tuned", "plain")


@pytest.fixture(scope="module")
def data():
    return overconfident(1500, 10, seed=2)


def _nll_value_and_grad(z, y, u):
    w = jnp.full(z.shape[:1], 1.0 / z.shape[0], jnp.float32)
    f = jax.jit(jax.value_and_grad(lambda u: _temperature.nll_objective(z, y, w)(u)))
    value, grad = f(jnp.float32(u))
    return float(value), float(grad)


@pytest.mark.parametrize("mode", MODES)
def test_nll_objective_value_and_derivative_match_float64(mode, data):
    z, y = data
    # Several blocks of rows (the last one shifted) on the tuned path.
    assert _cpu_kernels.block_rows(len(y), 1 << 12) < len(y)
    for u in (-0.5, 0.4, 1.2):
        with kernels.use(mode, "posthoc_temperature"):
            value, grad = _nll_value_and_grad(jnp.asarray(z), jnp.asarray(y), u)
        t = np.exp(u)
        np.testing.assert_allclose(value, ref.nll(z, y, t), rtol=1e-5)
        h = 1e-4  # central difference of the float64 NLL in log T
        slope = (ref.nll(z, y, np.exp(u + h)) - ref.nll(z, y, np.exp(u - h))) / (2 * h)
        np.testing.assert_allclose(grad, slope, rtol=1e-4, atol=1e-6)


def test_exp_sums_agree_across_forms_on_several_blocks(monkeypatch, data):
    z, _ = data
    # Small blocks: the tuned loop runs 4 blocks, the last one shifted.
    monkeypatch.setattr(_cpu_kernels, "BLOCK_ELEMENTS", 4000)
    zj = jnp.asarray(z)
    m = jnp.max(zj, axis=1)
    per_row = jnp.linspace(0.2, 2.0, len(z))
    out = {}
    for mode in MODES:
        with kernels.use(mode, "posthoc_temperature"):
            out[mode] = jax.jit(
                lambda z, m, s: (
                    _temperature.exp_sums(z, m, 0.5),
                    _temperature.exp_sums(z, m, s),
                )
            )(zj, m, per_row)
    for a, b in zip(jax.tree.leaves(out["tuned"]), jax.tree.leaves(out["plain"])):
        np.testing.assert_allclose(a, b, rtol=2e-6)
    # The tuned pass's W is the derivative of S in s.
    _, w = jax.jit(lambda z, m: _cpu_kernels.exp_sums(z, m, 0.5, with_w=True))(zj, m)
    _, dw = jax.jvp(lambda s: _temperature.exp_sums.plain(zj, m, s), (0.5,), (1.0,))
    np.testing.assert_allclose(w, dw, rtol=2e-5, atol=1e-6)


@pytest.mark.long
@pytest.mark.parametrize("mode", MODES)
def test_nll_fit_reaches_the_float64_optimum_in_both_forms(mode, data):
    z, y = data
    with kernels.use(mode, "posthoc_temperature"):
        t = float(posthoc.fit_temperature(z, y))
    scipy_t = ref.ts_nll_optimum_scipy(z, y)
    assert abs(t - scipy_t) <= 1e-3 * scipy_t


@pytest.mark.long
def test_sb_ece_fits_agree_across_forms(data):
    z, y = data
    fits = []
    for mode in MODES:
        with kernels.use(mode, "posthoc_temperature"):
            fits.append(float(posthoc.fit_temperature(z, y, objective="sb_ece")))
    np.testing.assert_allclose(fits[0], fits[1], rtol=1e-3)
    assert 2.0 < fits[0] < 4.0  # the logits are 3x over-confident


def test_forcing_the_family_changes_the_traced_program(data):
    z, y = data
    w = jnp.full((len(y),), 1.0 / len(y), jnp.float32)
    texts = set()
    for mode in MODES:
        with kernels.use(mode, "posthoc_temperature"):
            f = jax.grad(lambda u: _temperature.nll_objective(z, y, w)(u))
            texts.add(str(jax.make_jaxpr(f)(jnp.float32(0.0))))
    assert len(texts) == 2
