"""Binning-free metrics and the sweep ECE (calib_jax.metrics._ks_sweep) against the float64 references."""

from __future__ import annotations

import _reference_metrics as ref
import pytest
from metrics._cases import (
    all_cases,
    close,
    padded_case,
)

from calib_jax import metrics

CASES = all_cases()


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(CASES))
def test_binning_free_and_proper(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.ks_error(pp, pl, where=w), ref.ks_error(probs, labels))
    close(metrics.brier(pp, pl, where=w), ref.brier(probs, labels))
    close(metrics.nll(pp, pl, where=w), ref.nll(probs, labels))
    close(metrics.accuracy(pp, pl, where=w), ref.accuracy(probs, labels))


@pytest.mark.long
@pytest.mark.parametrize("case", ["softmax_k10", "ties", "n1", "all_correct", "edges"])
def test_sweep_ece(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.sweep_ece(pp, pl, where=w), ref.sweep_ece(probs, labels))
    close(metrics.sweep_ece(pp, pl, where=w, p=2), ref.sweep_ece(probs, labels, p=2))
