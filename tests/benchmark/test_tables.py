"""The markdown tables of the benchmark report, from rows."""

from __future__ import annotations

import numpy as np

from calib_jax import metrics
from calib_jax.benchmark import aggregation, evaluate, tables


def _rows():
    """Rows as cell_rows writes them (values drawn at random)."""
    rng = np.random.default_rng(7)
    rows = []
    for seed in (0, 1):
        for cal in ("none", "ts:nll"):
            for shift in ("clean", "noise/1"):
                r = {
                    "method": "ce",
                    "calibrator": cal,
                    "seed": seed,
                    "shift": shift,
                    "corruption": "clean" if shift == "clean" else "noise",
                    "severity": 0 if shift == "clean" else 1,
                }
                for m in evaluate.METRICS:
                    r[m] = float(rng.uniform(0.1, 0.9))
                if shift == "clean":
                    for f in evaluate.OOD_FIELDS:
                        r[f] = float(rng.uniform())
                    for m in evaluate.BOOTSTRAP_METRICS:
                        r[f"{m}_lo"], r[f"{m}_hi"] = r[m] - 0.01, r[m] + 0.02
                rows.append(r)
    return rows


def test_report_tables_of_ood_scores_and_intervals():
    rows = _rows()
    lines = tables.ood_table(aggregation.Rows(rows), "digits_patches")
    assert lines[0] == "## OOD detection against `digits_patches`"
    header = [c.strip() for c in lines[4].strip("|").split("|")]
    assert header == [
        "method",
        "calibrator",
        "AUROC",
        "AUPR-In",
        "AUPR-Out",
        "FPR at 95% TPR",
    ]
    line = next(ln for ln in lines if ln.startswith("| ce | ts:nll |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    vals = [
        r["ood_auroc"]
        for r in rows
        if r["calibrator"] == "ts:nll" and r["shift"] == "clean"
    ]
    assert cells[2] == aggregation.fmt(np.mean(vals), np.std(vals, ddof=1) / np.sqrt(2))

    lines = tables.bootstrap_table(aggregation.Rows(rows), 0.9)
    assert lines[0] == "## Bootstrap 90% intervals (clean test, seed 0)"
    line = next(ln for ln in lines if ln.startswith("| ce | none |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    r = next(
        r
        for r in rows
        if (r["calibrator"], r["seed"], r["shift"]) == ("none", 0, "clean")
    )
    assert cells[2] == (
        f"{100 * r['accuracy']:.2f} [{100 * r['accuracy_lo']:.2f}, "
        f"{100 * r['accuracy_hi']:.2f}]"
    )
    assert cells[5] == f"{r['nll']:.3f} [{r['nll_lo']:.3f}, {r['nll_hi']:.3f}]"
    # Rows of a run without them: no tables.
    old = [
        {
            k: v
            for k, v in r.items()
            if "_lo" not in k and "_hi" not in k and not k.startswith("ood_")
        }
        for r in rows
    ]
    assert tables.ood_table(old) == [] and tables.bootstrap_table(old) == []


def test_metric_columns_are_the_summary_keys_in_order():
    rows = _rows()
    assert tables.ALL_METRICS == tuple(metrics.SUMMARY_METRICS)
    lines = tables.metrics_table(aggregation.Rows(rows), "none", "all")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["method", *metrics.SUMMARY_METRICS]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    for key, cell in zip(metrics.SUMMARY_METRICS, cells[1:]):
        vals = [
            r[key] for r in rows if r["calibrator"] == "none" and r["shift"] != "clean"
        ]
        mean, sem = np.mean(vals), np.std(vals, ddof=1) / np.sqrt(2)
        want = (
            f"{mean:.3f} ± {sem:.3f}"
            if key == "nll"
            else (f"{100 * mean:.2f} ± {100 * sem:.2f}")
        )
        assert cell == want, key


def test_table2_columns_follow_the_calibrators_and_shifts_of_the_grid():
    rows = _rows()
    lines = tables.table2(rows, "ece_l2_em")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [
        "method",
        "Accuracy (clean)",
        "ECE (clean)",
        "ECE+TS (clean)",
        "Accuracy (shifted)",
        "ECE (shifted)",
        "ECE+TS (shifted)",
    ]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    vals = [
        r["ece_l2_em"]
        for r in rows
        if r["calibrator"] == "ts:nll" and r["shift"] != "clean"
    ]
    assert cells[6] == aggregation.fmt(np.mean(vals), np.std(vals, ddof=1) / np.sqrt(2))
    clean = [r for r in rows if r["shift"] == "clean"]
    assert tables.table2(clean, "ece")[0] == (
        "| method | Accuracy (clean) | ECE (clean) | ECE+TS (clean) |"
    )
    assert evaluate.METRICS["ece_l2_em"].startswith("ECE, 15 equal-mass bins, l2")
