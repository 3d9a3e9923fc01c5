"""Binning-free metrics and the sweep ECE (calib_jax.metrics._ks_sweep) against the float64 references."""

from __future__ import annotations

import _reference_metrics as ref
import numpy as np
import pytest
from metrics._cases import (
    all_cases,
    padded,
)

from calib_jax import metrics

CASES = all_cases()


def _padded(case):
    """(probs, labels, where) padded to one shape per K; see _cases.padded."""
    return padded(*CASES[case])


PRESETS = sorted(ref.PRESET_RULES)
TOL = {"rtol": 1e-5, "atol": 2e-6}


def _close(value, expected, **tol):
    np.testing.assert_allclose(float(value), expected, **(tol or TOL))


@pytest.mark.parametrize("case", sorted(CASES))
def test_binning_free_and_proper(case):
    probs, labels = CASES[case]
    pp, pl, w = _padded(case)
    _close(metrics.ks_error(pp, pl, where=w), ref.ks_error(probs, labels))
    _close(metrics.brier(pp, pl, where=w), ref.brier(probs, labels))
    _close(metrics.nll(pp, pl, where=w), ref.nll(probs, labels))
    _close(metrics.accuracy(pp, pl, where=w), ref.accuracy(probs, labels))


@pytest.mark.parametrize("case", ["softmax_k10", "ties", "n1", "all_correct", "edges"])
def test_sweep_ece(case):
    probs, labels = CASES[case]
    pp, pl, w = _padded(case)
    _close(metrics.sweep_ece(pp, pl, where=w), ref.sweep_ece(probs, labels))
    _close(metrics.sweep_ece(pp, pl, where=w, p=2), ref.sweep_ece(probs, labels, p=2))
