"""report.md from rows: the embedded figures and the reliability rows file."""

from __future__ import annotations

import json

import numpy as np

from calib_jax.benchmark import evaluate, report
from configs import benchmark_digits


def test_figures_lists_the_embedded_images_in_order():
    text = "a ![x](one.png) b\n\n![y, z](two.png)\n[not](three.png)"
    assert report.figures(text) == ["one.png", "two.png"]


def test_report_reads_the_reliability_rows_file_of_the_workdir(tmp_path):
    config = benchmark_digits.get_config()
    config.seeds = (0, 1)
    rng = np.random.default_rng(0)
    rows, reliability = [], []
    for method in ("ce", "focal"):
        for seed in (0, 1):
            key = {
                "method": method,
                "calibrator": "none",
                "seed": seed,
                "shift": "clean",
                "corruption": "clean",
                "severity": 0,
            }
            values = {m: float(rng.uniform(0.1, 0.9)) for m in evaluate.METRICS}
            rows.append({**key, **values})
            count = rng.integers(0, 20, 15)
            edges = np.linspace(0, 1, 16)
            reliability.append(
                {
                    **key,
                    "count": count.tolist(),
                    "confidence": (edges[:-1] + 1 / 30).tolist(),
                    "accuracy": rng.uniform(size=15).tolist(),
                    "lower": edges[:-1].tolist(),
                    "upper": edges[1:].tolist(),
                    "ece": values["ece"],
                }
            )
    assert report.read_reliability(tmp_path) == []
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in reliability)
    (tmp_path / evaluate.RELIABILITY_FILE).write_text(text)
    assert report.read_reliability(tmp_path) == reliability
    path = report.write_report(config, tmp_path, rows)
    embedded = report.figures(path.read_text())
    best = min(
        ("ce", "focal"),
        key=lambda m: np.mean([r["ece"] for r in rows if r["method"] == m]),
    )
    assert embedded == [
        "accuracy_vs_ece.png",
        "reliability_baseline.png",
        "reliability_best.png",
    ]
    assert f"![reliability, best: {best}](reliability_best.png)" in path.read_text()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(embedded)


def test_report_headings_name_the_configured_bins(tmp_path):
    config = benchmark_digits.get_config()
    config.seeds = (0,)
    config.num_bins = 10
    rng = np.random.default_rng(1)
    rows = []
    for method in ("ce", "focal"):
        key = {"method": method, "calibrator": "none", "seed": 0}
        for shift, severity in (("clean", 0), ("gaussian_noise_1", 1)):
            values = {m: float(rng.uniform(0.1, 0.9)) for m in evaluate.METRICS}
            values["spiegelhalter_p"] = values["ece_consistency_p"] = 0.5
            rows.append(
                {
                    **key,
                    "shift": shift,
                    "corruption": shift.rpartition("_")[0] or "clean",
                    "severity": severity,
                    **values,
                }
            )
    text = report.write_report(config, tmp_path, rows, []).read_text()
    assert "15 equal" not in text
    headings = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert (
        "## Table 2 layout (soft-calibration paper): ECE with 10 equal-mass bins, l2"
        in (headings)
    )
    for start in (
        "## Table 2 layout: ECE with 10 equal-width bins, l1",
        "## ECE (10 equal-width bins, l1) of every method under every calibrator",
        "## ECE (10 equal-width bins, l1) under every calibrator (shifted)",
    ):
        assert any(h.startswith(start) for h in headings), start
    assert "`ece` = ECE, 10 equal-width bins, l1" in text
    assert "the ECE's values (10 equal-width bins, l1)" in text
