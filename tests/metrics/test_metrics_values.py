"""Adaptive, class-wise, marginal, debiased, robustness and OOD metrics against the
float64 loop references on the shared cases."""

from __future__ import annotations

import _reference_metrics as ref
import jax
import numpy as np
import pytest
from metrics._cases import (
    all_cases,
    classwise_edge_case,
    close,
    padded_case,
    softmax_case,
)

from calib_jax import metrics

CASES = all_cases()

PRESETS = sorted(ref.PRESET_RULES)


@pytest.mark.parametrize("case", ["softmax_k10", "ties", "n1", "all_wrong", "edges"])
@pytest.mark.parametrize(
    "preset", ["calib_jax", "netcal", "focal_calibration", "robustness_metrics"]
)
@pytest.mark.long
def test_adaptive_ece(case, preset):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    expected = ref.ece(probs, labels, m=15, preset=preset, binning="mass")
    close(metrics.adaptive_ece(pp, pl, where=w, convention=preset), expected)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("num_bins", [3, 7, 15])
def test_robustness_metrics_equal_mass_both_norms(p, num_bins):
    """GCE (adaptive, max_prob) of robustness_metrics, l1 and l2, including
    confidences of exactly 1.0 (their own bin) and rounding half to even."""
    rng = np.random.default_rng(num_bins)
    n = 2 * num_bins + 1  # j n / M hits .5 for some j when M is odd
    probs = rng.dirichlet(np.full(4, 0.3), size=n).astype(np.float32)
    probs[:3] = np.float32([1.0, 0.0, 0.0, 0.0])
    labels = rng.integers(0, 4, size=n).astype(np.int32)
    expected = ref.ece(
        probs, labels, m=num_bins, p=p, preset="robustness_metrics", binning="mass"
    )
    got = metrics.adaptive_ece(
        probs, labels, num_bins=num_bins, p=p, convention="robustness_metrics"
    )
    close(got, expected)


@pytest.mark.parametrize("num_bins", [1, 4, 70])
def test_adaptive_ece_bin_counts_with_ties(num_bins):
    probs, labels = CASES["ties"]
    pp, pl, w = padded_case(CASES, "ties")
    expected = ref.ece(probs, labels, m=num_bins, binning="mass")
    close(metrics.adaptive_ece(pp, pl, where=w, num_bins=num_bins), expected)


@pytest.mark.long
@pytest.mark.parametrize("case", ["softmax_k10", "softmax_k2", "n1", "all_correct"])
@pytest.mark.parametrize("preset", PRESETS)
def test_classwise_ece(case, preset):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    expected = ref.classwise_ece(probs, labels, preset=preset)
    close(metrics.classwise_ece(pp, pl, where=w, convention=preset), expected)


@pytest.mark.parametrize("preset", PRESETS)
def test_classwise_on_edges_zero_and_one(preset):
    probs, labels = classwise_edge_case()
    expected = ref.classwise_ece(probs, labels, m=5, preset=preset)
    got = metrics.classwise_ece(probs, labels, num_bins=5, convention=preset)
    close(got, expected)


def test_classwise_l2_root_placement():
    probs, labels = CASES["softmax_k10"]
    pp, pl, w = padded_case(CASES, "softmax_k10")
    after = metrics.classwise_ece(pp, pl, where=w, p=2)
    close(after, ref.classwise_ece(probs, labels, p=2, root="after_mean"))
    per_class = metrics.Convention(name="pc", l2_root="per_class")
    got = metrics.classwise_ece(pp, pl, where=w, p=2, convention=per_class)
    close(got, ref.classwise_ece(probs, labels, p=2, root="per_class"))
    assert float(got) <= float(after) + 1e-7  # Jensen: mean of roots <= root of mean


@pytest.mark.long
@pytest.mark.parametrize("case", ["softmax_k10", "softmax_k2", "ties", "n1"])
@pytest.mark.parametrize("debias", [False, True])
def test_marginal_ece_matches_kumar_binning(case, debias):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    expected = ref.marginal_ece(probs, labels, m=15, debias=debias)
    close(metrics.marginal_ece(pp, pl, where=w, debias=debias), expected)


@pytest.mark.parametrize("case", ["softmax_k10", "ties", "n1", "all_correct"])
def test_debiased_ece(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.debiased_ece(pp, pl, where=w), ref.debiased_ece(probs, labels))


def test_ood_metrics_with_ties():
    rng = np.random.default_rng(5)
    s_in = rng.choice(np.float32([0.2, 0.5, 0.7, 0.9, 0.95]), size=101)
    s_out = rng.choice(np.float32([0.1, 0.5, 0.7, 0.8]), size=57)
    close(metrics.ood_auroc(s_in, s_out), ref.ood_auroc(s_in, s_out))
    for tpr in (0.95, 0.5, 1.0):
        got = metrics.fpr_at_95_tpr(s_in, s_out, tpr=tpr)
        close(got, ref.fpr_at_tpr(s_in, s_out, tpr))


@pytest.mark.long
@pytest.mark.parametrize("positive", ["in", "out"])
def test_ood_aupr_equals_the_float64_definition_with_ties_and_masks(positive):
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(11)
    s_in = rng.choice(np.float32([0.2, 0.5, 0.7, 0.9, 0.95]), size=101)
    s_out = rng.choice(np.float32([0.1, 0.5, 0.7, 0.8]), size=57)
    want = ref.ood_aupr(s_in, s_out, positive)
    close(metrics.ood_aupr(s_in, s_out, positive=positive), want)
    sign = 1.0 if positive == "in" else -1.0
    is_in = np.r_[np.ones(101), np.zeros(57)]
    sk = average_precision_score(
        is_in if positive == "in" else 1 - is_in, sign * np.r_[s_in, s_out]
    )
    assert want == pytest.approx(sk, abs=1e-12)
    # Continuous scores (no ties), under jit; masked rows equal slicing.
    s_in, s_out = rng.normal(1, 1, 80).astype(np.float32), rng.normal(0, 1, 50)
    s_out = s_out.astype(np.float32)
    want = ref.ood_aupr(s_in[:70], s_out[:45], positive)
    w_in, w_out = np.arange(80) < 70, np.arange(50) < 45
    fn = jax.jit(
        lambda a, b, wa, wb: metrics.ood_aupr(
            a, b, positive=positive, where_in=wa, where_out=wb
        )
    )
    close(fn(s_in, s_out, w_in, w_out), want)
    close(
        metrics.ood_aupr(
            s_in, s_out, positive=positive, where_in=w_in, where_out=w_out
        ),
        want,
    )
    # Indistinguishable scores: the share of the positive class.
    flat = np.full(10, 0.5, np.float32)
    share = 10 / 16 if positive == "in" else 6 / 16
    close(metrics.ood_aupr(flat, flat[:6], positive=positive), share)


def test_ood_accepts_probabilities_as_msp():
    p_in, _ = softmax_case(n=50, seed=7, boost=4.0)
    p_out, _ = softmax_case(n=40, seed=8, boost=0.0)
    expected = ref.ood_auroc(p_in.max(axis=1), p_out.max(axis=1))
    close(metrics.ood_auroc(p_in, p_out), expected)
    expected = ref.ood_aupr(p_in.max(axis=1), p_out.max(axis=1))
    close(metrics.ood_aupr(p_in, p_out), expected)
