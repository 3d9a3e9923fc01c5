"""AURC and E-AURC (calib_jax.metrics._aurc) against the float64 references."""

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


@pytest.mark.parametrize("case", sorted(CASES))
def test_aurc_eaurc(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.aurc(pp, pl, where=w), ref.aurc(probs, labels), atol=1e-5, rtol=1e-5)
    got = metrics.eaurc(pp, pl, where=w)
    close(got, ref.eaurc(probs, labels), atol=1e-5, rtol=1e-5)
    assert float(got) >= -1e-6


def test_eaurc_geifman_closed_form():
    probs, labels = CASES["softmax_k10"]
    got = metrics.eaurc(probs, labels, optimum="geifman")
    close(got, ref.eaurc(probs, labels, "geifman"), atol=1e-5, rtol=1e-5)
