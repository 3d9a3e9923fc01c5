"""Conformal-set fields of the benchmark rows and their report table."""

import numpy as np
import pytest

from calib_jax import conformal, posthoc
from calib_jax.benchmark import aggregation, conformal_sets, evaluate, tables


def _logits(seed, n=400, k=6):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n).astype(np.int32)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += rng.uniform(0, 4, n)
    return (3.0 * z).astype(np.float32), y


@pytest.mark.long
def test_rows_carry_conformal_coverage_and_size_of_each_calibrated_cell():
    logits = {"val": _logits(0), "test": _logits(1), "noise/1": _logits(2)}
    rows = []
    for seed in (0, 1):
        rows += evaluate.cell_rows(
            logits, method="ce", seed=seed, calibrators=("none", "ts:nll")
        )
    ts = posthoc.fit("ts:nll", *logits["val"])
    for r in rows[:4]:
        apply = ts.apply if r["calibrator"] == "ts:nll" else (lambda z: z)
        split = "test" if r["shift"] == "clean" else r["shift"]
        z, y = logits[split]
        for m in conformal_sets.METHODS:
            pred = conformal.fit(
                m, apply(logits["val"][0]), logits["val"][1], alpha=0.1
            )
            sets = pred.predict_sets(apply(z))
            assert r[f"conformal_{m}_coverage"] == pytest.approx(
                float(conformal.coverage(sets, y)), abs=1e-6
            )
            assert r[f"conformal_{m}_size"] == pytest.approx(
                float(conformal.set_size(sets)), rel=1e-6
            )
    lines = tables.conformal_table(aggregation.Rows(rows))
    assert lines[0] == "## Conformal prediction sets (alpha = 0.1)"
    table = next(ln for ln in lines if ln.startswith("| ce | ts:nll |"))
    cells = [c.strip() for c in table.strip("|").split("|")]
    cov = [
        r["conformal_raps_coverage"]
        for r in rows
        if r["calibrator"] == "ts:nll" and r["shift"] == "clean"
    ]
    header = [c.strip() for c in lines[4].strip("|").split("|")]
    want = aggregation.fmt(np.mean(cov), np.std(cov, ddof=1) / np.sqrt(2))
    assert cells[header.index("RAPS coverage")] == want
    # Rows without the fields (an older run) give no table.
    old = [{k: v for k, v in r.items() if "conformal" not in k} for r in rows]
    assert tables.conformal_table(old) == []
