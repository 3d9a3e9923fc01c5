"""CORP decomposition against scikit-learn's IsotonicRegression in float64.

The reference recalibrates with ``IsotonicRegression`` (which pools equal
forecasts, as CORP does) and scores in float64 NumPy; the identities
MCB - DSC + UNC = score, MCB >= 0, DSC >= 0 and MCB = 0 for forecasts that
are their own isotonic fit hold on every case.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from metrics._cases import softmax_case
from scipy.special import xlogy
from sklearn.isotonic import IsotonicRegression

from calib_jax import metrics


def _forecasts64(probs, labels, mode):
    p = np.asarray(probs, np.float64)
    if mode == "binary":
        return p[:, 1], (np.asarray(labels) == 1).astype(np.float64)
    return p.max(axis=1), (p.argmax(axis=1) == labels).astype(np.float64)


def _mean_score(x, o, score):
    if score == "brier":
        return np.mean((x - o) ** 2)
    with np.errstate(divide="ignore"):
        return -np.mean(xlogy(o, x) + xlogy(1 - o, 1 - x))


def _reference(x, o, score):
    fit = IsotonicRegression(out_of_bounds="clip").fit_transform(x, o)
    s_x = _mean_score(x, o, score)
    s_c = _mean_score(fit, o, score)
    s_r = _mean_score(np.full_like(x, o.mean()), o, score)
    return np.array([s_x, s_x - s_c, s_r - s_c, s_r])


def _binary_case(n=500, seed=0, power=1.0):
    """K = 2 rows [1 - q, q] with labels ~ Bernoulli(p), q = p ** power."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n)
    y = (rng.uniform(size=n) < p).astype(np.int32)
    q = (p**power).astype(np.float32)
    return np.stack([1 - q, q], axis=1), y


def _cases():
    probs, labels = softmax_case(n=600, k=10, seed=1)
    # Ties: confidences rounded to 2 decimals (the rest of the row keeps the
    # simplex; only the maximum is read).
    tied = probs.copy()
    top = tied.argmax(axis=1)
    rounded = np.round(tied[np.arange(600), top], 2)
    tied = tied * ((1 - rounded) / (1 - tied[np.arange(600), top]))[:, None]
    tied[np.arange(600), top] = rounded
    return {
        "top_label": (probs, labels, "top_label"),
        "top_label_ties": (tied.astype(np.float32), labels, "top_label"),
        "binary_overconfident": (*_binary_case(seed=2, power=2.0), "binary"),
        "binary_calibrated": (*_binary_case(seed=3), "binary"),
    }


CASES = _cases()


@pytest.mark.parametrize("score", ["brier", "log"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_corp_matches_sklearn_isotonic_in_float64(case, score):
    probs, labels, mode = CASES[case]
    out = metrics.corp_decomposition(probs, labels, score=score, mode=mode)
    ref = _reference(*_forecasts64(probs, labels, mode), score)
    got = np.array([float(v) for v in out])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    score_, mcb, dsc, unc = got
    assert mcb >= 0 and dsc >= 0
    assert abs(mcb - dsc + unc - score_) <= 1e-5


def test_ties_are_pooled():
    # Two equal forecasts with outcomes 1 and 0 get one recalibrated value
    # (1/2), not the ordered 0, 1 that an unpooled fit of (0, 1) may give.
    probs = np.float32([[0.4, 0.6], [0.4, 0.6], [0.8, 0.2]])
    labels = np.int32([1, 0, 0])
    d = metrics.corp_decomposition(probs, labels, mode="binary")
    # x = (0.6, 0.6, 0.2), o = (1, 0, 0): fit (0.5, 0.5, 0).
    s_c = (0.25 + 0.25 + 0.0) / 3
    x = np.array([0.6, 0.6, 0.2], np.float32).astype(np.float64)
    s_x = np.mean((x - np.array([1, 0, 0])) ** 2)
    np.testing.assert_allclose(float(d.miscalibration), s_x - s_c, rtol=1e-6)


@pytest.mark.parametrize("score", ["brier", "log"])
def test_mcb_is_zero_for_forecasts_that_are_their_own_isotonic_fit(score):
    # Forecasts 1/4, 1/2, 3/4 (exact in float32), each group of 8 with that
    # frequency of ones: the isotonic fit returns them unchanged.
    x = np.repeat(np.float32([0.25, 0.5, 0.75]), 8)
    o = np.concatenate([np.arange(8) < 2, np.arange(8) < 4, np.arange(8) < 6])
    probs = np.stack([1 - x, x], axis=1)
    d = metrics.corp_decomposition(
        probs, o.astype(np.int32), score=score, mode="binary"
    )
    assert float(d.miscalibration) == 0.0
    np.testing.assert_allclose(float(d.score), float(d.uncertainty - d.discrimination))


def test_scores_are_the_binary_scores_of_the_mode():
    probs, labels = softmax_case(n=300, k=5, seed=4)
    top = metrics.corp_decomposition(probs, labels)
    x, o = _forecasts64(probs, labels, "top_label")
    # Top label: the binary Brier score of (confidence, correct), not the
    # multiclass metrics.brier.
    np.testing.assert_allclose(float(top.score), np.mean((x - o) ** 2), rtol=1e-6)
    assert abs(float(top.score) - float(metrics.brier(probs, labels))) > 1e-3
    pb, yb = _binary_case(n=300, seed=5)
    brier = metrics.corp_decomposition(pb, yb, mode="binary")
    np.testing.assert_allclose(
        2 * float(brier.score), float(metrics.brier(pb, yb)), rtol=1e-5
    )
    log = metrics.corp_decomposition(pb, yb, score="log", mode="binary")
    np.testing.assert_allclose(float(log.score), float(metrics.nll(pb, yb)), rtol=1e-5)
    # UNC of the log score is the entropy of the base rate in nats.
    r = yb.mean()
    np.testing.assert_allclose(
        float(log.uncertainty), -(r * np.log(r) + (1 - r) * np.log(1 - r)), rtol=1e-6
    )


def test_log_score_is_infinite_only_through_the_forecasts():
    probs, labels = _binary_case(n=50, seed=6)
    probs[0] = [0.0, 1.0]
    labels[0] = 0  # a forecast of probability 1 that was wrong
    d = metrics.corp_decomposition(probs, labels, score="log", mode="binary")
    assert np.isinf(float(d.score)) and np.isinf(float(d.miscalibration))
    assert np.isfinite(float(d.discrimination)) and np.isfinite(float(d.uncertainty))
    # The same forecast of 1 that was right scores 0: everything finite.
    labels[0] = 1
    d = metrics.corp_decomposition(probs, labels, score="log", mode="binary")
    assert all(np.isfinite(float(v)) for v in d)


def test_where_equals_slicing():
    probs, labels, _ = CASES["top_label"]
    keep = np.random.default_rng(0).uniform(size=probs.shape[0]) < 0.7
    for score in ("brier", "log"):
        masked = metrics.corp_decomposition(probs, labels, score=score, where=keep)
        sliced = metrics.corp_decomposition(probs[keep], labels[keep], score=score)
        np.testing.assert_allclose(masked, sliced, rtol=1e-6)


def test_options_and_traced_inputs_are_one_line_errors():
    probs, labels = softmax_case(n=16, k=3, seed=0)
    with pytest.raises(ValueError, match="score must be one of"):
        metrics.corp_decomposition(probs, labels, score="crps")
    with pytest.raises(ValueError, match="mode must be one of"):
        metrics.corp_decomposition(probs, labels, mode="classwise")
    with pytest.raises(ValueError, match="K = 2 columns"):
        metrics.corp_decomposition(probs, labels, mode="binary")
    with pytest.raises(ValueError, match="runs on the host"):
        jax.jit(metrics.corp_decomposition)(probs, labels)


def test_bad_values_are_rejected_eagerly():
    probs, labels = softmax_case(n=16, k=3, seed=0)
    probs[2, 0] = np.inf
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\)"):
        metrics.corp_decomposition(probs, labels)
