"""The markdown tables of the benchmark report, each a function of result rows.

Every cell is an aggregate of :mod:`.aggregation` printed by
:func:`.aggregation.fmt` (percent with two decimals, NLL as is). The columns
come from the row keys: :data:`calib_jax.benchmark.evaluate.METRICS` (the keys
of :data:`calib_jax.metrics.SUMMARY_METRICS`), ``OOD_FIELDS``,
``BOOTSTRAP_METRICS`` and the conformal fields.
"""

from __future__ import annotations

import math

from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import conformal_sets, evaluate

# The columns of the soft-calibration paper's Table 2: (header, calibrator,
# row key); None is the ECE convention of the table.
TABLE2 = (
    ("Accuracy", "none", "accuracy"),
    ("ECE", "none", None),
    ("ECE+TS", "ts:nll", None),
    ("ECE+TS-SB-ECE", "ts:sb_ece", None),
)
ALL_METRICS = tuple(evaluate.METRICS)


def markdown(header: list[str], body: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return out


def table2(rows, metric: str) -> list[str]:
    """Soft-calibration Table 2 layout for one ECE convention (clean, then shifted)."""
    cals = set(agg.calibrators(rows))
    cols = [(n, c, m or metric) for n, c, m in TABLE2 if c in cals]
    shifts = ["clean"] + (["all"] if agg.has_shift(rows) else [])
    header = ["method"] + [
        f"{name} ({'clean' if s == 'clean' else 'shifted'})"
        for s in shifts
        for name, _, _ in cols
    ]
    body = []
    for method in agg.methods(rows):
        body.append(
            [method]
            + [
                agg.fmt(*agg.aggregate(rows, method, cal, m, s))
                for s in shifts
                for _, cal, m in cols
            ]
        )
    return markdown(header, body)


def metrics_table(rows, calibrator: str, shift="clean") -> list[str]:
    """Every metric of every method under one calibrator."""
    header = ["method"] + list(ALL_METRICS)
    body = [
        [m]
        + [
            agg.fmt(*agg.aggregate(rows, m, calibrator, k, shift), k)
            for k in ALL_METRICS
        ]
        for m in agg.methods(rows)
    ]
    return markdown(header, body)


def calibrator_table(rows, metric: str, shift="clean") -> list[str]:
    """``metric`` of every method (rows) under every calibrator (columns)."""
    cals = agg.calibrators(rows)
    body = [
        [m] + [agg.fmt(*agg.aggregate(rows, m, c, metric, shift)) for c in cals]
        for m in agg.methods(rows)
    ]
    return markdown(["method"] + cals, body)


def conformal_table(rows) -> list[str]:
    """Coverage and mean size of the conformal sets, per method x calibrator.

    Empty when the rows carry no conformal fields (results of an older run).
    """
    fields = [
        conformal_sets.field(m, w)
        for m in conformal_sets.METHODS
        for w in ("coverage", "size")
    ]
    if not rows or not all(f in r for r in rows for f in fields):
        return []
    shifted = agg.has_shift(rows)
    header = ["method", "calibrator"]
    for m in conformal_sets.METHODS:
        header += [f"{m.upper()} coverage", f"{m.upper()} size"]
        header += [f"{m.upper()} coverage (shifted)"] if shifted else []
    body = []
    for method in agg.methods(rows):
        for cal in agg.calibrators(rows):
            cells = [method, cal]
            for m in conformal_sets.METHODS:
                cov = conformal_sets.field(m, "coverage")
                size = agg.aggregate(rows, method, cal, conformal_sets.field(m, "size"))
                cells.append(agg.fmt(*agg.aggregate(rows, method, cal, cov)))
                cells.append(
                    "-" if math.isnan(size[0]) else f"{size[0]:.2f} ± {size[1]:.2f}"
                )
                if shifted:
                    cells.append(agg.fmt(*agg.aggregate(rows, method, cal, cov, "all")))
            body.append(cells)
    return [
        f"## Conformal prediction sets (alpha = {conformal_sets.ALPHA})",
        "",
        (
            "Split-conformal THR (LAC), APS and RAPS (lambda = 0.1, k_reg = 1), "
            "non-randomised, fitted on the validation logits after each "
            "calibrator (`calib_jax.conformal`); coverage in percent (the "
            f"guarantee is >= {100 * (1 - conformal_sets.ALPHA):.0f}% on the "
            "clean test set, not under shift) and mean set size on the clean "
            "test set; `(shifted)`: coverage averaged over the shifted sets. "
            "Mean ± SEM over seeds."
        ),
        "",
        *markdown(header, body),
        "",
    ]


def ood_table(rows, ood_name: str = "") -> list[str]:
    """OOD detection scores per method x calibrator (clean rows; [] without them)."""
    fields = list(evaluate.OOD_FIELDS)
    clean = [r for r in rows if r["shift"] == "clean"]
    if not clean or not all(f in r for r in clean for f in fields):
        return []
    header = ["method", "calibrator"] + list(evaluate.OOD_FIELDS.values())
    body = [
        [method, cal] + [agg.fmt(*agg.aggregate(rows, method, cal, f)) for f in fields]
        for method in agg.methods(rows)
        for cal in agg.calibrators(rows)
    ]
    name = f" against `{ood_name}`" if ood_name else ""
    return [
        f"## OOD detection{name}",
        "",
        (
            "The clean test set (positive) against the OOD set by the maximum "
            "softmax probability after each calibrator: AUROC, AUPR with the "
            "test set (In) or the OOD set (Out) as the positive class, and the "
            "false-positive rate on the OOD set at 95% recall of the test set "
            "(`calib_jax.metrics.ood_auroc`, `ood_aupr`, `fpr_at_95_tpr`), in "
            "percent. Mean ± SEM over seeds."
        ),
        "",
        *markdown(header, body),
        "",
    ]


def interval(row: dict, metric: str) -> str:
    """``'value [lo, hi]'`` of ``metric`` in ``row`` (percent, NLL as is); ``'-'``."""
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None:
        return "-"
    if metric in agg.RAW:
        return f"{row[metric]:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"{100 * row[metric]:.2f} [{100 * lo:.2f}, {100 * hi:.2f}]"


def bootstrap_table(rows, confidence: float = 0.95) -> list[str]:
    """Per-cell bootstrap intervals of the first seed's clean test set.

    One row per method x calibrator: ``value [lo, hi]`` of every metric of
    :data:`calib_jax.benchmark.evaluate.BOOTSTRAP_METRICS`. Empty when the
    rows carry no intervals.
    """
    names = evaluate.BOOTSTRAP_METRICS
    clean = [r for r in rows if r["shift"] == "clean"]
    if not clean or not any(f"{names[0]}_lo" in r for r in clean):
        return []
    seed = min(r["seed"] for r in clean)
    cell = {(r["method"], r["calibrator"]): r for r in clean if r["seed"] == seed}
    body = []
    for method in agg.methods(rows):
        for cal in agg.calibrators(rows):
            row = cell.get((method, cal))
            if row is not None:
                body.append([method, cal] + [interval(row, m) for m in names])
    return [
        f"## Bootstrap {100 * confidence:.0f}% intervals (clean test, seed {seed})",
        "",
        (
            "Sampling uncertainty of the test set for one trained model: "
            "percentile intervals over resamples of the clean test rows "
            "(`calib_jax.metrics.bootstrap`, every metric on the same "
            "resamples, a fixed key per cell shared by its calibrators), as "
            "`value [lo, hi]`; percent, NLL as is. Every seed's intervals are "
            "in `results.jsonl` (`<metric>_lo`, `<metric>_hi`). Binned ECE "
            "is biased upward on a resample (its repeated rows sharpen the "
            "bins), so an ECE interval can lie above the value: read it as the "
            "spread due to the test sample, not as a bias-corrected interval. "
            "Metrics: "
            + "; ".join(f"`{m}` = {evaluate.METRICS[m]}" for m in names)
            + "."
        ),
        "",
        *markdown(["method", "calibrator", *names], body),
        "",
    ]


def claims_table(entries) -> list[str]:
    """The claims table of ``entries`` (:func:`.paper_claims.claims` of some rows).

    The report's *Claims* section and the README's claims summary both print
    this table.
    """
    return markdown(
        [
            "paper",
            "claim",
            "metric",
            "measured (paired difference, pp)",
            "smallest detectable (2 x paired SEM, pp)",
            "verdict",
        ],
        [
            [
                c["paper"],
                c["claim"],
                c["metric"],
                c["measured"],
                c["detectable"],
                c["verdict"],
            ]
            for c in entries
        ],
    )
