"""ECE, RMSCE, MCE and reliability bins (calib_jax.metrics._ece) against the float64 loop references."""

from __future__ import annotations

import _reference_metrics as ref
import numpy as np
import pytest
from metrics._cases import (
    all_cases,
    close,
    padded_case,
    wide_cases,
)

from calib_jax import metrics

CASES = all_cases()

PRESETS = sorted(ref.PRESET_RULES)


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("preset", PRESETS)
def test_ece_all_presets(case, preset):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    expected = ref.ece(probs, labels, m=15, preset=preset)
    close(metrics.ece(pp, pl, where=w, convention=preset), expected)


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(wide_cases()))
def test_top_label_paths_for_many_classes(case):
    probs, labels = wide_cases()[case]
    close(metrics.ece(probs, labels), ref.ece(probs, labels))
    close(metrics.mce(probs, labels), ref.ece(probs, labels, p="inf"))
    close(metrics.accuracy(probs, labels), ref.accuracy(probs, labels))
    close(metrics.brier(probs, labels), ref.brier(probs, labels))
    close(metrics.classwise_ece(probs, labels), ref.classwise_ece(probs, labels))


@pytest.mark.parametrize("case", sorted(CASES))
def test_rmsce_mce(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.rmsce(pp, pl, where=w), ref.ece(probs, labels, p=2))
    close(metrics.mce(pp, pl, where=w), ref.ece(probs, labels, p="inf"))


@pytest.mark.parametrize("preset", PRESETS)
def test_edges_ten_bins(preset):
    # 0.7 is below float32(0.7) in float64: the presets disagree on it.
    probs, labels = CASES["edges"]
    pp, pl, w = padded_case(CASES, "edges")
    expected = ref.ece(probs, labels, m=10, preset=preset)
    close(metrics.ece(pp, pl, where=w, num_bins=10, convention=preset), expected)


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_reliability_bins(binning):
    probs, labels = CASES["softmax_k10"]
    pp, pl, w = padded_case(CASES, "softmax_k10")
    got = metrics.reliability_bins(pp, pl, where=w, binning=binning)
    conf, correct = ref.top_label(probs, labels)
    if binning == "equal_width":
        members = ref.binned_members(conf, 15, "calib_jax")
    else:
        members = ref.equal_mass_members(conf, 15, "rank")
    counts = [len(m) for m in members]
    np.testing.assert_array_equal(got["count"], counts)
    for b, idx in enumerate(members):
        if idx:
            np.testing.assert_allclose(
                got["confidence"][b], np.mean(conf[idx]), rtol=1e-5
            )
            np.testing.assert_allclose(
                got["accuracy"][b], np.mean(correct[idx]), rtol=1e-5
            )
            assert got["lower"][b] <= min(conf[idx]) + 1e-7
            assert got["upper"][b] >= max(conf[idx]) - 1e-7
