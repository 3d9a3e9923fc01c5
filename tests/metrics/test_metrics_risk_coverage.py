"""AUGRC, risk at coverage and coverage at risk against float64 references."""

from __future__ import annotations

import _reference_metrics as ref
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from metrics._cases import all_cases, binary_case, padded, softmax_case, wide_cases

from calib_jax import metrics

CASES = all_cases()
TOL = {"rtol": 1e-5, "atol": 1e-6}
COVERAGES = [0.1, 0.25, 0.5, 0.73, 0.9, 1.0]
RISKS = [0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0]


def _close(value, expected):
    np.testing.assert_allclose(float(value), expected, **TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_augrc_matches_both_reference_forms(case):
    probs, labels = CASES[case]
    pp, pl, w = padded(probs, labels)
    expected = ref.augrc(probs, labels)
    # The curve-area definition and the paper's AUROC form agree exactly.
    assert ref.augrc_from_auroc(probs, labels) == pytest.approx(expected, abs=1e-12)
    _close(metrics.augrc(pp, pl, where=w), expected)


@pytest.mark.parametrize("case", sorted(wide_cases()))
def test_augrc_many_classes(case):
    probs, labels = wide_cases()[case]
    _close(metrics.augrc(probs, labels), ref.augrc(probs, labels))


def test_augrc_bounds():
    probs, labels = CASES["all_correct"]
    assert float(metrics.augrc(probs, labels)) == 0.0
    probs, labels = CASES["all_wrong"]
    assert float(metrics.augrc(probs, labels)) == pytest.approx(0.5, abs=1e-7)


@pytest.mark.parametrize("case", sorted(CASES))
def test_risk_at_coverage(case):
    probs, labels = CASES[case]
    pp, pl, w = padded(probs, labels)
    for c in COVERAGES:
        got = metrics.risk_at_coverage(pp, pl, coverage=c, where=w)
        _close(got, ref.risk_at_coverage(probs, labels, c))
    # Full coverage is the error rate.
    full = metrics.risk_at_coverage(pp, pl, coverage=1.0, where=w)
    _close(full, 1.0 - ref.accuracy(probs, labels))


@pytest.mark.long
@pytest.mark.parametrize("case", sorted(CASES))
def test_coverage_at_risk(case):
    probs, labels = CASES[case]
    pp, pl, w = padded(probs, labels)
    for r in RISKS:
        got = metrics.coverage_at_risk(pp, pl, risk=r, where=w)
        _close(got, ref.coverage_at_risk(probs, labels, r))


def test_edge_cases():
    probs, labels = CASES["all_wrong"]
    assert float(metrics.coverage_at_risk(probs, labels, risk=0.99)) == 0.0
    assert float(metrics.coverage_at_risk(probs, labels, risk=1.0)) == 1.0
    assert float(metrics.risk_at_coverage(probs, labels, coverage=0.01)) == 1.0
    probs, labels = CASES["all_correct"]
    assert float(metrics.coverage_at_risk(probs, labels, risk=0.0)) == 1.0
    # A risk met exactly counts: 1 error in the 4 most confident rows.
    probs, labels = binary_case([0.9, 0.8, 0.7, 0.6, 0.55], [1, 0, 1, 1, 0])
    assert metrics.coverage_at_risk(probs, labels, risk=0.25) == np.float32(0.8)
    assert float(metrics.risk_at_coverage(probs, labels, coverage=0.8)) == 0.25
    # Coverage 0.3 of 5 rows accepts ceil(1.5) = 2 rows.
    assert float(metrics.risk_at_coverage(probs, labels, coverage=0.3)) == 0.5


def test_ties_resolved_by_expectation_and_row_order_free():
    # Four rows tied at 0.7 with one error, ahead of a correct 0.6 row.
    probs, labels = binary_case([0.7, 0.7, 0.7, 0.7, 0.6], [1, 0, 1, 1, 1])
    # 2 of the tie group accepted: expected errors 2 * 1/4.
    assert float(metrics.risk_at_coverage(probs, labels, coverage=0.4)) == 0.25
    rng = np.random.default_rng(0)
    probs, labels = CASES["ties"]
    perm = rng.permutation(len(labels))
    for fn in (
        metrics.augrc,
        lambda p, y: metrics.risk_at_coverage(p, y, coverage=0.37),
        lambda p, y: metrics.coverage_at_risk(p, y, risk=0.2),
    ):
        assert float(fn(probs, labels)) == float(fn(probs[perm], labels[perm]))


@pytest.mark.long
def test_jit_where_and_sharding():
    probs, labels = softmax_case(n=200, k=10, seed=41)
    pp, pl, w = padded(probs, labels)
    funcs = {
        "augrc": lambda p, y, w=None: metrics.augrc(p, y, where=w),
        "risk": lambda p, y, w=None: metrics.risk_at_coverage(
            p, y, coverage=0.6, where=w
        ),
        "cov": lambda p, y, w=None: metrics.coverage_at_risk(p, y, risk=0.3, where=w),
    }
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    sp, sl, sw = (jax.device_put(x, rows) for x in (pp, pl, w))
    # XLA may turn a division by the static N into a multiplication, so the
    # masked (traced N) and unmasked values can differ in the last ulp.
    for name, fn in funcs.items():
        eager = float(fn(probs, labels))
        masked = float(fn(pp, pl, w))
        assert masked == pytest.approx(eager, rel=1e-6), name
        # jit of the whole function, inputs sharded over 8 devices.
        assert float(jax.jit(fn)(sp, sl, sw)) == pytest.approx(masked, rel=1e-6), name


def test_bad_arguments():
    probs, labels = softmax_case(n=20, k=3, seed=42)
    for bad in (0.0, -0.5, 1.5, float("nan"), "half"):
        with pytest.raises(ValueError, match="coverage must"):
            metrics.risk_at_coverage(probs, labels, coverage=bad)
    for bad in (-0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"risk must lie in \[0, 1\]"):
            metrics.coverage_at_risk(probs, labels, risk=bad)
    with pytest.raises(ValueError, match="risk must be a scalar"):
        metrics.coverage_at_risk(probs, labels, risk=np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="sum to 1"):
        metrics.augrc(probs * 0.5, labels)
