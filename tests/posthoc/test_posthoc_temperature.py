"""Temperature scaling: the four objectives against float64 references."""

import functools

import _reference_posthoc as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import posthoc


@pytest.fixture(scope="module")
def small():
    return overconfident(2000, 10, seed=0)


def test_nll_matches_dense_search_and_scipy(small):
    z, y = small
    t = float(posthoc.fit_temperature(z, y))
    dense = ref.ts_nll_dense_search(z, y)
    scipy_t = ref.ts_nll_optimum_scipy(z, y)
    assert abs(t - dense) <= 1e-3 * dense
    assert abs(t - scipy_t) <= 1e-3 * scipy_t
    # Known over-confidence: logits are 3x the calibrated ones.
    assert abs(t - 3.0) < 0.15


@pytest.mark.long
def test_nll_at_50k_by_1000_is_a_local_optimum_within_1e3():
    z, y = overconfident(50_000, 1000, seed=1)
    t = float(jax.jit(posthoc.fit_temperature)(z, y))
    assert abs(t - 3.0) < 0.05
    # Dense float64 grid around T: offsets of 5e-4 in log T. The NLL is
    # unimodal in T, so an argmin at an inner point puts the optimum
    # within (-1e-3, 1e-3) of log T.
    d = z.astype(np.float64)
    d -= d.max(axis=1, keepdims=True)
    d_y = d[np.arange(len(y)), y]
    offsets = np.array([-1e-3, -5e-4, 0.0, 5e-4, 1e-3])
    values = []
    for off in offsets:
        s = 1.0 / (t * np.exp(off))
        values.append(np.mean(np.log(np.exp(s * d).sum(axis=1)) - s * d_y))
    assert 1 <= int(np.argmin(values)) <= 3, values


@pytest.mark.long
def test_where_equals_slicing(small):
    z, y = small
    keep = np.arange(len(y)) % 3 != 0
    z_bad = z.copy()
    z_bad[~keep] = np.nan  # excluded rows may hold anything
    for objective in ("nll", "ece_grid"):
        masked = posthoc.fit_temperature(z_bad, y, where=keep, objective=objective)
        sliced = posthoc.fit_temperature(z[keep], y[keep], objective=objective)
        np.testing.assert_allclose(masked, sliced, rtol=1e-5)


@pytest.mark.long
def test_vmap_over_seeds_matches_loop():
    # Same shape as the other tests' sets: the single fits reuse their compile.
    data = [overconfident(2000, 10, seed=s, scale=1.0 + s) for s in range(4)]
    zs = jnp.stack([d[0] for d in data])
    ys = jnp.stack([d[1] for d in data])
    batched = np.asarray(jax.vmap(posthoc.fit_temperature)(zs, ys))
    single = np.array([float(posthoc.fit_temperature(z, y)) for z, y in data])
    np.testing.assert_allclose(batched, single, rtol=1e-5)
    np.testing.assert_allclose(batched, [1.0, 2.0, 3.0, 4.0], rtol=0.1)
    # The registry path vmaps too: a Calibrator with batched parameters.
    cals = jax.vmap(lambda z, y: posthoc.fit("ts", z, y))(zs, ys)
    np.testing.assert_allclose(cals.params["temperature"], single, rtol=1e-5)
    assert cals.name == "ts:nll"


def test_ece_grid_matches_brute_force_with_smallest_t_on_ties(small):
    z, y = small
    t = float(posthoc.fit_temperature(z, y, objective="ece_grid"))
    grid = np.arange(1, 101) / 10.0
    eces = [
        ref.top_label_ece(ref.softmax(z / g), y, 15, p=1, right_closed=True)
        for g in grid
    ]
    best = grid[int(np.argmin(eces))]  # argmin: first (smallest T) on ties
    assert t == pytest.approx(best, abs=1e-6)


def test_ece_grid_ties_go_to_smallest_temperature():
    # Perfect, confident predictions: every T in the grid with all
    # confidences in the top bin has the same ECE; 0.1 must win.
    z = np.array([[30.0, 0.0], [0.0, 30.0]] * 8, np.float32)
    y = np.array([0, 1] * 8, np.int32)
    eces = [
        ref.top_label_ece(ref.softmax(z / g), y, right_closed=True) for g in (0.1, 0.2)
    ]
    assert eces[0] == eces[1]
    assert float(posthoc.fit_temperature(z, y, objective="ece_grid")) == pytest.approx(
        0.1
    )


def test_hb_ece_search_beats_its_coarse_grid(small):
    z, y = small
    t = float(posthoc.fit_temperature(z, y, objective="hb_ece"))

    def ece(temp):
        return ref.top_label_ece(ref.softmax(z / temp), y, 15, p=2)

    coarse = np.exp(np.linspace(np.log(0.05), np.log(20.0), 17))
    assert ece(t) <= min(ece(c) for c in coarse) + 1e-6
    # Hard ECE at the found T is far below the uncalibrated value.
    assert ece(t) < 0.5 * ece(1.0)


@pytest.mark.long
def test_sb_ece_reaches_a_local_minimum(small):
    from calib_jax.losses._soft_ece import sb_ece

    z, y = small
    t = float(posthoc.fit_temperature(z, y, objective="sb_ece"))
    zc = jnp.asarray(z - z.max(axis=1, keepdims=True))

    def objective(u):
        return sb_ece(zc * jnp.exp(-u), jnp.asarray(y))

    value, grad = jax.value_and_grad(objective)(jnp.log(jnp.float32(t)))
    assert abs(float(grad)) < 1e-4
    for du in (-0.05, 0.05):
        assert float(objective(jnp.log(jnp.float32(t)) + du)) > float(value)
    assert float(value) < 0.3 * float(objective(jnp.float32(0.0)))
    assert 2.5 < t < 3.5


@pytest.mark.parametrize(
    ("kind", "p", "sb_temperature"), [("lb", 2.0, 0.01), ("bin", 1.0, 0.003)]
)
@pytest.mark.long
def test_sb_ece_objective_equals_loss_on_scaled_logits(small, kind, p, sb_temperature):
    # The fit evaluates SB-ECE from the blocked top-label confidences; value
    # and derivative in log T must be those of calib_jax.losses.sb_ece on
    # z / T, including the where handling (NaN padding is never read).
    from calib_jax.losses._soft_ece import sb_ece
    from calib_jax.posthoc._core import canonical
    from calib_jax.posthoc._temperature import sb_ece_objective

    z, y = small
    keep = np.arange(len(y)) % 4 != 0
    z_bad = z.copy()
    z_bad[~keep] = np.nan
    opts = {"num_bins": 15, "p": p, "kind": kind}
    for where in (None, keep):
        zz = z if where is None else z_bad
        z0, y0, _ = canonical(jnp.asarray(zz), jnp.asarray(y), where)
        fused = jax.jit(
            jax.value_and_grad(
                sb_ece_objective(z0, y0, where, temperature=sb_temperature, **opts)
            )
        )
        zc = jnp.asarray(z - z.max(axis=1, keepdims=True))

        def loss(u, zc=zc, where=where):
            return sb_ece(
                zc * jnp.exp(-u),
                jnp.asarray(y),
                temperature=sb_temperature,
                where=where,
                **opts,
            )

        for u in (-1.0, 0.0, 0.7, 1.1, 1.5):
            got = fused(jnp.float32(u))
            want = jax.value_and_grad(loss)(jnp.float32(u))
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.long
def test_sb_ece_where_equals_slicing_and_vmap(small):
    z, y = small
    keep = np.arange(len(y)) % 3 != 0
    z_bad = z.copy()
    z_bad[~keep] = np.nan
    masked = posthoc.fit_temperature(z_bad, y, where=keep, objective="sb_ece")
    sliced = posthoc.fit_temperature(z[keep], y[keep], objective="sb_ece")
    np.testing.assert_allclose(masked, sliced, rtol=1e-5)
    data = [overconfident(2000, 10, seed=s, scale=2.0 + s) for s in range(2)]
    zs = jnp.stack([d[0] for d in data])
    ys = jnp.stack([d[1] for d in data])
    fit = functools.partial(posthoc.fit_temperature, objective="sb_ece")
    batched = np.asarray(jax.vmap(fit)(zs, ys))
    single = np.array([float(fit(z, y)) for z, y in data])
    np.testing.assert_allclose(batched, single, rtol=1e-5)


def test_apply_temperature_and_dtypes():
    z = jnp.array([[2.0, -1.0, 0.5]], jnp.bfloat16)
    out = posthoc.apply_temperature(z, 2.0)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, [[1.0, -0.5, 0.25]])
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        posthoc.apply_temperature(z, 0.0)
    with pytest.raises(ValueError, match="objective must be one of"):
        posthoc.fit_temperature(z, jnp.array([0]), objective="mse")


@pytest.mark.long
def test_bf16_input_gives_same_temperature_as_float32(small):
    z, y = small
    z16 = jnp.asarray(z, jnp.bfloat16)
    t16 = posthoc.fit_temperature(z16, y)
    t32 = posthoc.fit_temperature(jnp.asarray(z16, jnp.float32), y)
    assert t16.dtype == jnp.float32
    np.testing.assert_allclose(t16, t32, rtol=1e-6)
