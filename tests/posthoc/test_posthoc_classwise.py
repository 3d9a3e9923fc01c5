"""Class-wise loss scaling (Jung et al., ICML 2023)."""

import _reference_posthoc as ref
import jax
import numpy as np
import pytest
from posthoc._data import long_tailed

from calib_jax import posthoc

K = 10


@pytest.fixture(scope="module")
def lt():
    val = long_tailed(0, k=K)
    test = long_tailed(1, k=K, balanced=300)
    return val, test


def _class_loss_std(cal, logits, labels):
    out = np.asarray(cal.apply(logits), np.float64)
    return float(np.std(ref.class_mean_nll(out, labels, K)))


def _ece(cal, logits, labels):
    return ref.top_label_ece(ref.softmax(np.asarray(cal.apply(logits))), labels)


def test_normalisation_and_weights_match_numpy():
    rng = np.random.default_rng(0)
    losses = rng.gamma(2.0, 1.0, size=7)
    norm = posthoc.normalize_class_losses(losses)
    np.testing.assert_allclose(norm, ref.nd_normalize(losses), rtol=1e-5, atol=1e-6)
    w = posthoc.scaling_weights(norm, 0.7, 1.8)
    np.testing.assert_allclose(w, ref.scaling_weights(norm, 0.7, 1.8), atol=1e-6)
    present = np.array([True] * 5 + [False] * 2)
    masked = posthoc.normalize_class_losses(losses, present)
    np.testing.assert_allclose(masked[:5], ref.nd_normalize(losses[:5]), rtol=1e-5)
    np.testing.assert_array_equal(masked[5:], 0.0)


def test_alpha_beta_minimise_eq6_within_bounds():
    rng = np.random.default_rng(1)
    l0 = rng.gamma(2.0, 1.0, size=K)
    l1 = l0 - rng.uniform(0.0, 0.5, size=K)
    alpha, beta = posthoc.fit_alpha_beta(l0, l1)
    lo_a, hi_a = 0.1, max(np.log(K) / 2, 1.0)
    assert lo_a <= alpha <= hi_a and 1.5 <= beta <= 2.0
    found = ref.eq6_objective(alpha, beta, l0, l1)
    grid = [
        ref.eq6_objective(a, b, l0, l1)
        for a in np.linspace(lo_a, hi_a, 60)
        for b in np.linspace(1.5, 2.0, 26)
    ]
    assert found <= min(grid) + 1e-6
    assert found < ref.eq6_objective(1.0, 1.5, l0, l1)


@pytest.mark.long
@pytest.mark.parametrize("base", ["ts"])
def test_long_tailed_class_loss_spread_shrinks(lt, base):
    (zv, yv), (zt, yt) = lt
    plain = posthoc.fit(base, zv, yv)
    scaled = posthoc.fit(f"{base}+classwise", zv, yv)
    aux = scaled.aux
    beta = aux["beta"]
    w = np.asarray(aux["class_weights"])
    assert np.all(np.abs(w) < beta / 2) and np.all(1.0 + w > 0)
    # Under-fitted (tail, high-loss) classes are up-weighted.
    assert w[-1] > 0 > w[0]
    for z, y in ((zv, yv), (zt, yt)):
        assert _class_loss_std(scaled, z, y) < 0.7 * _class_loss_std(plain, z, y)
    # ECE on the balanced test set, with and without scaling.
    ece_plain, ece_scaled = _ece(plain, zt, yt), _ece(scaled, zt, yt)
    assert ece_scaled < ece_plain
    if base == "ts":
        np.testing.assert_array_equal(np.argmax(scaled.apply(zt), 1), np.argmax(zt, 1))


def test_classwise_rejects_non_nll_objective(lt):
    (zv, yv), _ = lt
    with pytest.raises(ValueError, match="needs objective 'nll'"):
        posthoc.fit("ts:sb_ece+classwise", zv, yv)


def test_calibrator_is_a_pytree_through_jit(lt):
    (zv, yv), (zt, _) = lt
    cal = posthoc.fit("ts", zv, yv)
    out = jax.jit(lambda c, z: c.apply(z))(cal, zt)
    np.testing.assert_allclose(out, zt / float(cal.params["temperature"]), rtol=1e-6)
