"""Aggregation of benchmark rows: per-seed values, mean ± SEM, paired verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from calib_jax.benchmark import aggregation


def _grid_rows():
    """Two methods x two calibrators x three seeds x (clean + 2 corruptions x 2)."""
    rng = np.random.default_rng(1)
    rows = []
    for method in ("ce", "focal"):
        for cal in ("none", "ts:nll"):
            for seed in (0, 1, 2):
                for shift in ("clean", "a/1", "b/1", "a/3", "b/3"):
                    rows.append(
                        {
                            "method": method,
                            "calibrator": cal,
                            "seed": seed,
                            "shift": shift,
                            "severity": 0 if shift == "clean" else int(shift[-1]),
                            "ece": float(rng.uniform()),
                        }
                    )
    return rows


def test_verdicts_and_paired_differences():
    rows = [
        {
            "method": m,
            "calibrator": "none",
            "seed": s,
            "shift": "clean",
            "severity": 0,
            "ece": v,
        }
        for m, vals in (("a", (0.1, 0.2, 0.3)), ("b", (0.3, 0.3, 0.6)))
        for s, v in enumerate(vals)
    ]
    d = aggregation.paired(rows, ("a", "none"), ("b", "none"), "ece")
    diffs = np.array([-0.2, -0.1, -0.3])
    assert d == pytest.approx((diffs.mean(), diffs.std(ddof=1) / np.sqrt(3)))
    assert aggregation.detectable(d) == pytest.approx(2 * d[1])
    assert d[0] + aggregation.detectable(d) < 0
    assert aggregation.verdict([d]) == "holds"
    tell = "cannot tell on this grid"
    assert aggregation.verdict([(-0.01, 0.02)]) == tell
    # Beyond one SEM but within two: the seeds cannot resolve it either way.
    assert aggregation.verdict([(-0.03, 0.02)]) == tell
    assert aggregation.verdict([(0.03, 0.02)]) == tell
    assert aggregation.verdict([d, (0.05, 0.02)]) == "does not hold"
    assert aggregation.verdict([d, (-0.05, 0.02)]) == "holds"
    assert aggregation.verdict([]) == "not measured"
    assert aggregation.paired(rows, ("a", "none"), ("c", "none"), "ece") is None


@pytest.mark.parametrize("indexed", [False, True])
def test_per_seed_shifts_and_mean_sem_against_numpy(indexed):
    rows = _grid_rows()
    data = aggregation.Rows(rows) if indexed else rows

    def values(method, cal, keep):
        return [
            np.mean(
                [
                    r["ece"]
                    for r in rows
                    if (r["method"], r["calibrator"], r["seed"]) == (method, cal, s)
                    and keep(r)
                ]
            )
            for s in (0, 1, 2)
        ]

    for shift, keep in (
        ("clean", lambda r: r["shift"] == "clean"),
        (0, lambda r: r["shift"] == "clean"),
        ("all", lambda r: r["shift"] != "clean"),
        (3, lambda r: r["severity"] == 3),
    ):
        want = values("focal", "ts:nll", keep)
        got = aggregation.per_seed(data, "focal", "ts:nll", "ece", shift)
        assert list(got) == [0, 1, 2]
        np.testing.assert_allclose(list(got.values()), want, rtol=1e-15)
        mean, sem = aggregation.aggregate(data, "focal", "ts:nll", "ece", shift)
        v = np.asarray(want, np.float64)
        assert mean == pytest.approx(v.mean(), rel=1e-15)
        assert sem == pytest.approx(v.std(ddof=1) / np.sqrt(3), rel=1e-12)
    # '*' pools every method's rows of a seed.
    star = aggregation.per_seed(data, "*", "none", "ece")
    for s in (0, 1, 2):
        pooled = [
            r["ece"]
            for r in rows
            if (r["calibrator"], r["seed"], r["shift"]) == ("none", s, "clean")
        ]
        assert star[s] == pytest.approx(np.mean(pooled), rel=1e-15)


def test_mean_sem_fmt_and_grid_queries():
    assert aggregation.mean_sem([0.25]) == (0.25, 0.0)
    assert all(np.isnan(aggregation.mean_sem([])))
    assert aggregation.fmt(0.01234, 0.005) == "1.23 ± 0.50"
    assert aggregation.fmt(0.51234, 0.0123, "nll") == "0.512 ± 0.012"
    assert aggregation.fmt(float("nan"), float("nan")) == "-"
    rows = _grid_rows()
    assert aggregation.methods(rows) == ["ce", "focal"]
    assert aggregation.calibrators(rows) == ["none", "ts:nll"]
    assert aggregation.has_shift(rows)
    assert not aggregation.has_shift([r for r in rows if r["shift"] == "clean"])
    clean = {
        m: aggregation.aggregate(rows, m, "none", "ece")[0] for m in ("ce", "focal")
    }
    assert aggregation.best(rows, ["ce", "focal"]) == min(clean, key=clean.get)
    lower = sum(
        aggregation.aggregate(rows, m, "ts:nll", "ece", "all")[0]
        < aggregation.aggregate(rows, m, "none", "ece", "all")[0]
        for m in ("ce", "focal")
    )
    got = aggregation.wins(rows, "ts:nll", "none", "ece", "all")
    assert got == f"lower for {lower} of 2 methods"
