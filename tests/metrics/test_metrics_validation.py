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
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
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
