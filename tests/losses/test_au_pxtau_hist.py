"""AU_Pxτ's histogram: the smoothed CDF, its coverage quantile, the state."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from _selective_helpers import batch as _batch

from calib_jax.losses._au_pxtau_hist import (
    au_pxtau_update_hist,
    coverage_threshold,
    log_survival,
)


def _ref_log_survival(score, hist, centres, nu):
    """float64 ``log(1 - G_nu(s))`` of Eq. (15), written directly."""
    s = np.asarray(score, np.float64)[:, None]
    h = np.asarray(hist, np.float64)[None, :]
    c = np.asarray(centres, np.float64)[None, :]
    g = np.sum(h / (1.0 + np.exp(-(s - c) / nu)), axis=1) / max(h.sum(), 1.0)
    with np.errstate(divide="ignore"):
        return np.log1p(-g)


@pytest.mark.long
@pytest.mark.parametrize("nu", [0.05, 0.1, 0.5])
def test_log_survival_matches_float64_eq15(nu):
    rng = np.random.default_rng(0)
    edges = np.linspace(0.0, 1.0, 16)
    centres = 0.5 * (edges[:-1] + edges[1:])
    hist = rng.integers(0, 20, 15).astype(np.float32)
    hist[3] = 0.0  # an empty bin contributes nothing
    score = rng.uniform(0.0, 0.9, 64).astype(np.float32)
    got = log_survival(jnp.asarray(score), jnp.asarray(hist), jnp.asarray(centres), nu)
    want = _ref_log_survival(score, hist, centres, nu)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=1e-6)


def test_log_survival_stays_finite_where_the_sigmoids_saturate():
    # All mass far below the score: 1 - G underflows in float32 when computed
    # directly; in log space it is about -(s - c) / nu.
    centres = jnp.asarray([0.05, 0.15])
    got = log_survival(jnp.asarray([0.95]), jnp.asarray([3.0, 1.0]), centres, 0.005)
    assert np.isfinite(float(got[0]))
    want = _ref_log_survival([0.95], [3.0, 1.0], [0.05, 0.15], 0.005)
    assert not np.isfinite(want[0])  # float64 direct form underflows to log(0)
    np.testing.assert_allclose(
        float(got[0]), -(0.95 - 0.15) / 0.005 + np.log(0.25), rtol=1e-4
    )


@pytest.mark.parametrize("coverage", [0.1, 0.5, 0.9, 1.0])
def test_coverage_threshold_is_the_interpolated_histogram_quantile(coverage):
    hist = np.array([2.0, 0.0, 5.0, 3.0], np.float32)
    edges = np.linspace(0.0, 1.0, 5)
    got = float(coverage_threshold(jnp.asarray(hist), jnp.asarray(edges), coverage))
    # float64: the first bin whose cumulative mass reaches the target, and the
    # fraction of that bin's mass needed, along its width.
    cum = np.cumsum(hist.astype(np.float64))
    target = coverage * cum[-1]
    k = int(np.searchsorted(cum, target, side="left"))
    frac = (target - (cum[k] - hist[k])) / hist[k]
    want = edges[k] + frac * (edges[k + 1] - edges[k])
    assert got == pytest.approx(want, abs=1e-6)
    # The mass below it is the coverage (the identity that defines it).
    below = np.sum(hist[: int(got // 0.25)]) + hist[min(int(got // 0.25), 3)] * (
        (got % 0.25) / 0.25
    )
    assert below == pytest.approx(coverage * hist.sum(), abs=1e-4)


def test_update_hist_counts_decay_and_mask():
    logits = np.array([[0.0, 0.0], [5.0, 0.0], [0.2, 0.0], [9.0, 0.0]], np.float32)
    # MSP = 0.5, 0.993, 0.55, 0.9999 in 4 bins of width 0.25.
    counts = au_pxtau_update_hist(jnp.zeros(4), logits)
    np.testing.assert_array_equal(counts, [0, 0, 2, 2])
    decayed = au_pxtau_update_hist(counts, logits, decay=0.5)
    np.testing.assert_array_equal(decayed, [0, 0, 3, 3])
    mask = jnp.asarray([True, False, True, False])
    np.testing.assert_array_equal(
        au_pxtau_update_hist(jnp.zeros(4), logits, where=mask), [0, 0, 2, 0]
    )
    # The top of the range (MSP == 1) falls in the last, closed bin.
    top = au_pxtau_update_hist(jnp.zeros(4), np.array([[1e4, 0.0]], np.float32))
    np.testing.assert_array_equal(top, [0, 0, 0, 1])
    ent = au_pxtau_update_hist(jnp.zeros(2), logits, csf="neg_entropy")
    np.testing.assert_array_equal(ent, [2, 2])  # entropies 0.69, 0.04, 0.69, 0.001


def test_update_hist_invalid_arguments_raise():
    logits, _ = _batch(12, b=8)
    with pytest.raises(ValueError, match="decay"):
        au_pxtau_update_hist(jnp.zeros(4), logits, decay=1.5)
    with pytest.raises(ValueError, match="hist"):
        au_pxtau_update_hist(jnp.zeros((2, 2)), logits)
