"""Host-facing calls reject bad input with a clear ValueError."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from metrics._cases import softmax_case

from calib_jax import metrics

PROBS, LABELS = softmax_case(n=20, k=3, seed=21)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.where(np.eye(20, 3, dtype=bool), np.nan, PROBS), "NaN or inf"),
        (np.where(np.eye(20, 3, dtype=bool), np.inf, PROBS), "NaN or inf"),
        (PROBS * 3.0, "probabilities in"),
        (np.log(PROBS), "jax.nn.softmax"),
        (PROBS * 0.5, "sum to 1"),
    ],
)
def test_bad_probabilities(bad, message):
    with pytest.raises(ValueError, match=message):
        metrics.ece(bad.astype(np.float32), LABELS)


def test_bad_labels_and_shapes():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, K\) = \[0, 3\)"):
        metrics.ece(PROBS, np.full(20, 3, np.int32))
    with pytest.raises(ValueError, match="out of range"):
        metrics.classwise_ece(PROBS, np.full(20, -1, np.int32))
    with pytest.raises(ValueError, match="N = 0"):
        metrics.ece(np.zeros((0, 3), np.float32), np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="shape"):
        metrics.ece(PROBS, LABELS[:5])
    with pytest.raises(TypeError, match="integer"):
        metrics.ece(PROBS, LABELS.astype(np.float32))
    with pytest.raises(ValueError, match="excludes every row"):
        metrics.ece(PROBS, LABELS, where=np.zeros(20, bool))


@pytest.mark.parametrize("num_bins", [0, -3, 2.5, True])
def test_bad_num_bins(num_bins):
    with pytest.raises(ValueError, match="num_bins"):
        metrics.ece(PROBS, LABELS, num_bins=num_bins)


def test_bad_options():
    with pytest.raises(ValueError, match="known presets"):
        metrics.ece(PROBS, LABELS, convention="sklearn")
    with pytest.raises(ValueError, match="binning"):
        metrics.ece(PROBS, LABELS, binning="quantile")
    with pytest.raises(ValueError, match="p must be"):
        metrics.ece(PROBS, LABELS, p=3)
    with pytest.raises(ValueError, match="known metrics"):
        metrics.get_metric("ece2")
    with pytest.raises(ValueError, match="tpr"):
        metrics.fpr_at_95_tpr(PROBS[:, 0], PROBS[:, 1], tpr=0.0)
    with pytest.raises(ValueError, match="positive must be 'in' or 'out'"):
        metrics.ood_aupr(PROBS[:, 0], PROBS[:, 1], positive="ood")


def test_registry_lists_every_metric():
    assert metrics.get_metric("ece") is metrics.ece
    assert set(metrics.METRICS) >= {
        "ece",
        "mce",
        "rmsce",
        "adaptive_ece",
        "classwise_ece",
        "marginal_ece",
        "ks_error",
        "sweep_ece",
        "debiased_ece",
        "brier",
        "nll",
        "accuracy",
        "aurc",
        "eaurc",
        "ood_auroc",
        "ood_aupr",
        "fpr_at_95_tpr",
        "reliability_bins",
    }


def test_value_checks_are_skipped_under_jit():
    # Traced inputs cannot be inspected: the jitted core runs check-free.
    logits = np.log(PROBS) * 3.0
    value = jax.jit(lambda p, y: metrics.ece(p, y))(logits, LABELS)
    assert value.shape == ()


# The value screen fused into the metric's own compiled call.

SCREENED = ("ece", "rmsce", "adaptive_ece", "classwise_ece")


@pytest.mark.long
@pytest.mark.parametrize("k", [3, 40, 37])  # packed rows, packed blocks, plain
@pytest.mark.parametrize("name", SCREENED)
def test_fused_eager_call_is_bit_identical_to_the_jitted_metric(name, k):
    probs, labels = softmax_case(n=700, k=k, seed=5)
    where = np.arange(700) % 7 != 3
    fn = metrics.get_metric(name)
    for w in (None, where):
        eager = np.asarray(fn(probs, labels, where=w))
        jitted = np.asarray(
            jax.jit(lambda p, y, w: fn(p, y, where=w))(probs, labels, w)
        )
        assert eager.tobytes() == jitted.tobytes(), (name, k, w is None)


@pytest.mark.parametrize("k", [3, 40])
@pytest.mark.parametrize(
    "value, message",
    [
        (-1e-30, r"found values in \[-1e-30"),  # tiny negative: still rejected
        (-0.25, "probabilities in"),
        (np.nan, r"NaN or inf in 1 row\(s\) \(first: row 6\)"),
        (-np.inf, r"NaN or inf in 1 row\(s\) \(first: row 6\)"),
        (1.5, "probabilities in"),
    ],
)
@pytest.mark.long
def test_fused_screen_rejects_every_bad_entry(k, value, message):
    probs, labels = softmax_case(n=64, k=k, seed=9)
    probs = np.array(probs, np.float32)
    probs[6, 1] = value
    for name in ("ece", "adaptive_ece", "classwise_ece"):
        with pytest.raises(ValueError, match=message):
            metrics.get_metric(name)(probs, labels)
    # Excluded, the same row is fine.
    keep = np.arange(64) != 6
    got = metrics.ece(probs, labels, where=keep)
    want = float(metrics.ece(probs[keep], labels[keep]))
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_fused_screen_passes_negative_zero_and_rows_at_the_tolerance():
    probs, labels = softmax_case(n=64, k=40, seed=9)
    probs = np.array(probs, np.float32)
    probs[2, 5] = -0.0  # read as 0 by the old check too
    probs[3] *= np.float32(1.0009)  # within the 1e-3 tolerance, past the screen
    assert np.isfinite(float(metrics.ece(probs, labels)))
    probs[3] *= np.float32(1.001)
    with pytest.raises(ValueError, match="row 3 sums to 1.001"):
        metrics.ece(probs, labels)
