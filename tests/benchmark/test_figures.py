"""The report's figures, drawn from result and reliability rows only."""

from __future__ import annotations

import pytest

import json

import jax
import numpy as np

from calib_jax import metrics, plots
from calib_jax.benchmark import figures


def test_severity_plot_methods_are_baseline_best_and_named_in_grid_order():
    methods = ["ce", "focal", "acls", "sb_ece", "two_stage"]
    assert figures.highlighted(methods, "ce", "sb_ece", ("two_stage", "nope")) == [
        "ce",
        "sb_ece",
        "two_stage",
    ]
    assert figures.highlighted(methods, "ce", "ce", ()) == ["ce"]


def _cell(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 300).astype(np.int32)
    z = rng.normal(size=(300, 4)).astype(np.float32)
    z[np.arange(300), y] += 1.5
    return jax.nn.softmax(z, axis=-1), y


@pytest.mark.long
def test_reliability_diagram_from_rows_is_the_diagram_from_probabilities(tmp_path):
    probs, labels = _cell(0)
    bins = metrics.reliability_bins(probs, labels)
    key = {"method": "ce", "calibrator": "none", "seed": 3, "shift": "clean"}
    row = {
        **key,
        "corruption": "clean",
        "severity": 0,
        **{k: np.asarray(bins[k]).tolist() for k in figures.BIN_DTYPES},
        "ece": float(metrics.ece(probs, labels)),
    }
    row = json.loads(json.dumps(row))  # as read back from reliability.jsonl
    result = {**key, "corruption": "clean", "severity": 0, "ece": row["ece"]}
    result["accuracy"] = float(metrics.accuracy(probs, labels))
    lines = figures.write_figures(
        tmp_path, [result], [row], seed=3, options={"min_count": 5}
    )
    assert "![reliability, best: ce](reliability_best.png)" in lines
    plots.reliability_diagram(
        probs,
        labels,
        min_count=5,
        title="ce (seed 3, clean test)",
        path=tmp_path / "direct.png",
    )
    direct = (tmp_path / "direct.png").read_bytes()
    assert (tmp_path / "reliability_baseline.png").read_bytes() == direct
    # Per-bin arrays come back in the metric's dtypes.
    back = figures.bins_of(row)
    for k, dtype in figures.BIN_DTYPES.items():
        assert back[k].dtype == dtype
        np.testing.assert_array_equal(back[k], np.asarray(bins[k]))
    # No reliability row: no diagram (and nothing else is read).
    other = tmp_path / "other"
    other.mkdir()
    lines = figures.write_figures(other, [result], [], seed=3, options={})
    assert not any("reliability" in ln for ln in lines)
    assert sorted(p.name for p in other.iterdir()) == ["accuracy_vs_ece.png"]
