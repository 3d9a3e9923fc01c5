"""The new post-hoc calibrators in the benchmark grid: rows for histogram
binning and isotonic regression; Platt and Beta only when K = 2."""

import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import metrics, posthoc
from calib_jax.benchmark import evaluate, grid


def _logits(k):
    val = overconfident(400, k, seed=0)
    test = overconfident(300, k, seed=1)
    return {"val": val, "test": test, "noise/1": overconfident(300, k, seed=2)}


def test_grid_lists_the_new_calibrators():
    for name in ("histogram_binning", "isotonic", "platt", "beta"):
        assert name in grid.CALIBRATORS
    assert grid.applicable(grid.CALIBRATORS, 10) == tuple(
        c for c in grid.CALIBRATORS if c not in ("platt", "beta")
    )
    assert grid.applicable(grid.CALIBRATORS, 2) == grid.CALIBRATORS


@pytest.mark.long
def test_cell_rows_skip_binary_only_calibrators_for_k_above_2():
    names = ("none", "histogram_binning", "isotonic", "platt", "beta")
    rows = evaluate.cell_rows(_logits(4), method="ce", seed=0, calibrators=names)
    assert sorted({r["calibrator"] for r in rows}) == [
        "histogram_binning",
        "isotonic",
        "none",
    ]
    # The histogram-binning row scores the calibrator's own probabilities.
    val, (zt, yt) = _logits(4)["val"], _logits(4)["test"]
    cal = posthoc.fit("histogram_binning", *val)
    (row,) = [
        r
        for r in rows
        if r["calibrator"] == "histogram_binning" and r["shift"] == "clean"
    ]
    ece = float(metrics.ece(np.exp(np.asarray(cal.apply(zt))), yt))
    assert row["ece"] == pytest.approx(ece, rel=1e-5)


@pytest.mark.long
def test_cell_rows_run_platt_and_beta_for_k_2():
    rows = evaluate.cell_rows(
        _logits(2), method="ce", seed=0, calibrators=("platt", "beta")
    )
    assert sorted({r["calibrator"] for r in rows}) == ["beta", "platt"]
    assert len(rows) == 4  # 2 calibrators x (clean + 1 shift)
