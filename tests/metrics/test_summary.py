"""metrics.summary: every value against a float64 reference, jit, vmap, names."""

from __future__ import annotations

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics._cases import softmax_case

from calib_jax import metrics

TOL = {"rtol": 1e-5, "atol": 2e-6}
# One shape for every test, so that the compiled metrics are shared.
N, K = 160, 5


def _case(seed):
    return softmax_case(n=N, k=K, seed=seed)


def _references(probs, labels, m=15) -> dict[str, float]:
    """Every summary key by the float64 loop references."""
    return {
        "accuracy": ref.accuracy(probs, labels),
        "ece_l2_em": ref.ece(probs, labels, m=m, p=2, binning="mass"),
        "ece": ref.ece(probs, labels, m=m),
        "adaptive_ece": ref.ece(probs, labels, m=m, binning="mass"),
        "classwise_ece": ref.classwise_ece(probs, labels, m=m),
        "ks_error": ref.ks_error(probs, labels),
        "brier": ref.brier(probs, labels),
        "nll": ref.nll(probs, labels),
        "aurc": ref.aurc(probs, labels),
    }


def test_every_value_matches_its_float64_reference():
    num_bins = 15
    probs, labels = _case(3)
    got = metrics.summary(probs, labels, num_bins=num_bins)
    assert list(got) == list(metrics.SUMMARY_METRICS)
    want = _references(probs, labels, m=num_bins)
    for key, value in got.items():
        assert value.dtype == jnp.float32, key
        np.testing.assert_allclose(float(value), want[key], **TOL, err_msg=key)


@pytest.mark.long
def test_values_are_the_public_metrics_bit_for_bit():
    probs, labels = _case(4)
    got = metrics.summary(probs, labels)
    assert got["accuracy"] == metrics.accuracy(probs, labels)
    assert got["ece"] == metrics.ece(probs, labels)
    assert got["ece_l2_em"] == metrics.ece(probs, labels, binning="equal_mass", p=2)
    assert got["adaptive_ece"] == metrics.adaptive_ece(probs, labels)
    assert got["classwise_ece"] == metrics.classwise_ece(probs, labels)
    assert got["ks_error"] == metrics.ks_error(probs, labels)
    assert got["brier"] == metrics.brier(probs, labels)
    assert got["nll"] == metrics.nll(probs, labels)
    assert got["aurc"] == metrics.aurc(probs, labels)


def test_where_drops_rows_like_slicing():
    probs, labels = _case(5)
    keep = np.random.default_rng(0).uniform(size=N) < 0.7
    got = metrics.summary(probs, labels, where=keep)
    want = _references(probs[keep], labels[keep])
    for key, value in got.items():
        np.testing.assert_allclose(float(value), want[key], **TOL, err_msg=key)


@pytest.mark.long
def test_jit_equals_eager_and_vmap_equals_a_loop():
    sets = [_case(s) for s in (6, 7, 8)]
    probs = np.stack([p for p, _ in sets])
    labels = np.stack([y for _, y in sets])
    run = jax.jit(lambda p, y: metrics.summary(p, y, num_bins=15))
    for p, y in sets:
        eager = metrics.summary(p, y, num_bins=15)
        jitted = run(p, y)
        for key in eager:
            np.testing.assert_allclose(
                float(jitted[key]), float(eager[key]), rtol=0, atol=0, err_msg=key
            )
    batched = jax.jit(jax.vmap(lambda p, y: metrics.summary(p, y, num_bins=15)))(
        probs, labels
    )
    for i in range(len(sets)):
        one = run(probs[i], labels[i])
        for key, value in batched.items():
            assert value.shape == (len(sets),)
            np.testing.assert_allclose(
                float(value[i]), float(one[key]), rtol=0, atol=0, err_msg=key
            )


def test_names_select_and_order_the_keys():
    probs, labels = _case(9)
    got = metrics.summary(probs, labels, names=metrics.SPLIT_METRICS)
    assert tuple(got) == metrics.SPLIT_METRICS
    full = metrics.summary(probs, labels)
    for key in metrics.SPLIT_METRICS:
        assert got[key] == full[key]
    with pytest.raises(ValueError, match=r"'ece_l3'.*valid: accuracy, ece_l2_em"):
        metrics.summary(probs, labels, names=("ece", "ece_l3"))


def test_summary_functions_are_cached_and_carry_the_conventions():
    fns = metrics.summary_functions(12)
    assert fns is metrics.summary_functions(12)
    assert fns["accuracy"] is metrics.accuracy
    assert fns["ece_l2_em"].keywords == {
        "binning": "equal_mass",
        "p": 2,
        "num_bins": 12,
    }
    assert set(fns) == set(metrics.SUMMARY_METRICS)


def test_bad_input_raises_the_metrics_own_error():
    probs, labels = _case(10)
    logits = np.log(probs) * 3.0  # not on the simplex
    with pytest.raises(ValueError, match="softmax"):
        metrics.summary(logits, labels)
    with pytest.raises(ValueError, match="labels"):
        metrics.summary(probs, labels + K)
