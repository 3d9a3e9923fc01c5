"""Each preset reproduces its library's number on hand-computed cases.

The expected values below are worked out by hand from each library's
documented rule (written next to each case); the libraries themselves are
not dependencies.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from metrics._cases import binary_case as _binary_case
from metrics._cases import padded


def binary_case(conf, correct):
    """K = 2 rows padded to 8 rows with a mask (one compilation per preset)."""
    probs, labels, where = padded(*_binary_case(conf, correct), size=8)
    return probs, labels, where


from calib_jax import metrics

# Case A, 5 bins: confidences on the edges 0.6, 0.8 and 1.0.
CONF_A = [0.5, 0.6, 0.6, 0.8, 0.8, 1.0, 1.0]
CORRECT_A = [1, 0, 0, 1, 1, 1, 0]
# [lo, hi) with 1.0 in the last bin (calib_jax, netcal, robustness_metrics):
#   [0.4,0.6): {0.5 ok}           |sum c - sum a| = 0.5
#   [0.6,0.8): {0.6 x, 0.6 x}     |1.2 - 0| = 1.2
#   [0.8,1.0]: {.8 ok,.8 ok,1 ok,1 x} |3.6 - 3| = 0.6    -> 2.3 / 7
# torchmetrics (bucketize(right=True) over M+1 edges, 1.0 in an extra bin):
#   0.5 + 1.2 + |1.6 - 2| + |2 - 1| = 3.1 -> 3.1 / 7
# focal-loss code ((lo, hi] bins):
#   (0.4,0.6]: {0.5, 0.6, 0.6} |1.7 - 1| = 0.7; (0.6,0.8]: {0.8, 0.8} 0.4;
#   (0.8,1.0]: {1, 1} 1.0 -> 2.1 / 7
ECE_A = {
    "calib_jax": 2.3 / 7,
    "netcal": 2.3 / 7,
    "robustness_metrics": 2.3 / 7,
    "torchmetrics": 3.1 / 7,
    "focal_calibration": 2.1 / 7,
}
# MCE: largest |acc - conf| over non-empty bins.
MCE_A = {
    "calib_jax": 0.6,  # bin [0.6, 0.8): conf 0.6, acc 0
    "torchmetrics": 0.6,
    "focal_calibration": 0.5,  # the bin {1.0, 1.0}: conf 1, acc 0.5
}


@pytest.mark.parametrize("preset", sorted(ECE_A))
def test_case_a_ece(preset):
    probs, labels, where = binary_case(CONF_A, CORRECT_A)
    got = metrics.ece(probs, labels, where=where, num_bins=5, convention=preset)
    np.testing.assert_allclose(float(got), ECE_A[preset], rtol=1e-5)


@pytest.mark.parametrize("preset", sorted(MCE_A))
def test_case_a_mce(preset):
    probs, labels, where = binary_case(CONF_A, CORRECT_A)
    got = metrics.mce(probs, labels, where=where, num_bins=5, convention=preset)
    np.testing.assert_allclose(float(got), MCE_A[preset], rtol=1e-5)


def test_case_a_torchmetrics_l2_and_bins():
    # norm='l2': sqrt(sum prop * gap^2) over the M + 1 bins:
    # (1 * 0.25 + 2 * 0.36 + 2 * 0.04 + 2 * 0.25) / 7 = 1.55 / 7.
    probs, labels, where = binary_case(CONF_A, CORRECT_A)
    got = metrics.rmsce(
        probs, labels, where=where, num_bins=5, convention="torchmetrics"
    )
    np.testing.assert_allclose(float(got), np.sqrt(1.55 / 7), rtol=1e-5)
    bins = metrics.reliability_bins(
        probs, labels, where=where, num_bins=5, convention="torchmetrics"
    )
    assert np.asarray(bins["count"]).tolist() == [0, 0, 1, 2, 2, 2]
    assert float(bins["lower"][-1]) == float(bins["upper"][-1]) == 1.0


def test_netcal_sample_threshold():
    # netcal's sample_threshold=2: the single-sample bin [0.4, 0.6) adds no
    # error but its sample stays in N: (1.2 + 0.6) / 7.
    probs, labels, where = binary_case(CONF_A, CORRECT_A)
    conv = dataclasses.replace(metrics.get_convention("netcal"), min_count=2)
    got = metrics.ece(probs, labels, where=where, num_bins=5, convention=conv)
    np.testing.assert_allclose(float(got), 1.8 / 7, rtol=1e-5)


# Case B, 10 bins: float32(0.7) = 0.69999999 lies below the float64 edge 0.7.
CONF_B = [0.7, 0.7, 0.75, 0.65]
CORRECT_B = [1, 1, 1, 0]
# float32 edges (calib_jax, torchmetrics, robustness_metrics' floor(c * 10)):
#   [0.7, 0.8): {0.7, 0.7, 0.75} |2.15 - 3| = 0.85; [0.6, 0.7): {0.65} 0.65
# netcal (float64 linspace edges): 0.7f falls in [0.6, 0.7):
#   {0.65, 0.7, 0.7} |2.05 - 2| = 0.05; {0.75} 0.25
ECE_B = {
    "calib_jax": 1.5 / 4,
    "torchmetrics": 1.5 / 4,
    "robustness_metrics": 1.5 / 4,
    "netcal": 0.3 / 4,
}


@pytest.mark.parametrize("preset", sorted(ECE_B))
def test_case_b_float64_edges(preset):
    probs, labels, where = binary_case(CONF_B, CORRECT_B)
    got = metrics.ece(probs, labels, where=where, num_bins=10, convention=preset)
    np.testing.assert_allclose(float(got), ECE_B[preset], rtol=1e-5)


def test_focal_classwise_drops_zero_but_counts_it():
    # Class 1 has probabilities 0, 0, 0.5 with outcomes 0, 1, 1 (5 bins).
    # Default: [0, 0.2) holds both zeros: |0 - 1| = 1, plus {0.5}: 0.5 -> 1.5/3.
    # Focal-loss code: zeros are in no (lo, hi] bin: only 0.5 -> 0.5/3.
    # Class 0 (1, 1, 0.5 with outcomes 1, 0, 0) is 1.5/3 under both.
    probs = np.float32([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    labels = np.int32([0, 1, 1])
    default = metrics.classwise_ece(probs, labels, num_bins=5)
    focal = metrics.classwise_ece(
        probs, labels, num_bins=5, convention="focal_calibration"
    )
    np.testing.assert_allclose(float(default), (0.5 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(focal), (0.5 + 0.5 / 3) / 2, rtol=1e-6)


# Case C, 3 equal-mass bins with ties.
CONF_C = [0.6, 0.6, 0.6, 0.8, 0.9, 0.9]
CORRECT_C = [1, 0, 1, 1, 0, 1]
# calib_jax 'rank': groups of 2 by rank; the three 0.6 stay together in the
# first: {.6,.6,.6} |1.8 - 2| = 0.2, {.8} 0.2, {.9,.9} |1.8 - 1| = 0.8 -> 1.2/6.
# focal-loss AdaptiveECE: edges interp(0, 2, 4, 6) = .6, .6, .9, .9; bins
# (lo, hi]: only (.6, .9] = {.8, .9, .9}: |2.6 - 2| = 0.6; the 0.6s equal the
# first edge and are in no bin -> 0.6/6.
# netcal equal_intervals=False: quantile edges at 0, 5/3, 10/3, 5 ->
# [0, .6, .8333, 1]: {.6,.6,.6,.8} |2.6 - 3| = 0.4, {.9,.9} 0.8 -> 1.2/6.
# robustness_metrics GCE (adaptive): round(0, 2, 4) indexes the sorted values,
# upper edges (.6, .9, 1.0), np.digitize: {} | {.6,.6,.6,.8} | {.9,.9} ->
# (0.4 + 0.8) / 6.
ADAPTIVE_C = {
    "calib_jax": 0.2,
    "focal_calibration": 0.1,
    "netcal": 0.2,
    "robustness_metrics": 0.2,
}


def test_case_c_robustness_metrics_l2():
    """GCE norm='l2': sqrt(sum_b n_b / N (acc_b - conf_b)^2)."""
    probs, labels, where = binary_case(CONF_C, CORRECT_C)
    got = metrics.adaptive_ece(
        probs, labels, where=where, num_bins=3, p=2, convention="robustness_metrics"
    )
    want = np.sqrt((4 / 6) * (0.4 / 4) ** 2 + (2 / 6) * (0.8 / 2) ** 2)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize("preset", sorted(ADAPTIVE_C))
def test_case_c_equal_mass(preset):
    probs, labels, where = binary_case(CONF_C, CORRECT_C)
    got = metrics.adaptive_ece(
        probs, labels, where=where, num_bins=3, convention=preset
    )
    np.testing.assert_allclose(float(got), ADAPTIVE_C[preset], rtol=1e-5)


@pytest.mark.parametrize("preset", ["torchmetrics"])
def test_presets_without_equal_mass_raise(preset):
    probs, labels, where = binary_case(CONF_C, CORRECT_C)
    with pytest.raises(ValueError, match="no equal-mass"):
        metrics.adaptive_ece(probs, labels, where=where, convention=preset)
