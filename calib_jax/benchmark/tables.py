"""The markdown tables of the benchmark report, each a function of result rows.

Every cell is an aggregate of :mod:`.aggregation` printed by
:func:`.aggregation.fmt` (percent with two decimals, NLL as is). The columns
come from the row keys: :data:`calib_jax.benchmark.evaluate.METRICS` (the keys
of :data:`calib_jax.metrics.SUMMARY_METRICS`), ``OOD_FIELDS`` and the
fields of every OOD score, ``BOOTSTRAP_METRICS``, the calibration tests'
p-values, the CORP decompositions and the conformal fields.
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


# Significance level of the share of shifted sets a calibration test rejects.
LEVEL = 0.05


def p_values(rows, method: str, calibrator: str, field: str) -> str:
    """The clean test set's p-values of ``field``, one per seed (``'0.012/0.200'``,
    seeds in order); ``'-'`` when the rows lack it."""
    values = agg.per_seed(
        [r for r in agg.select(rows, method, calibrator) if field in r],
        method,
        calibrator,
        field,
    )
    return "/".join(f"{v:.3f}" for v in values.values()) if values else "-"


def rejected(rows, method: str, calibrator: str, field: str) -> tuple[float, float]:
    """Mean ± SEM over seeds of the share of shifted sets with ``field`` <
    :data:`LEVEL` (NaN without shifted rows carrying ``field``)."""
    share: dict[int, list[float]] = {}
    for r in agg.select(rows, method, calibrator):
        if r["shift"] != "clean" and field in r:
            share.setdefault(r["seed"], []).append(float(r[field] < LEVEL))
    return agg.mean_sem(sum(v) / len(v) for v in share.values())


def _has(rows, field: str) -> bool:
    return any(field in r for r in rows if r["shift"] == "clean")


def _present(rows, method: str, calibrator: str, field: str, shift="clean"):
    """:func:`.aggregation.aggregate` over the rows that carry ``field`` (NaN,
    printed ``-``, when none does: e.g. mutual information of a single model)."""
    have = [r for r in agg.select(rows, method, calibrator) if field in r]
    return agg.mean_sem(agg.per_seed(have, method, calibrator, field, shift).values())


def metrics_table(rows, calibrator: str, shift="clean") -> list[str]:
    """Every metric of every method under one calibrator.

    On the clean test set, the ECE's p-values sit beside it when the rows
    carry them: Spiegelhalter's test (``ece p (Spiegelhalter)``) and the
    consistency resampling (``ece p (consistency)``), one per seed
    (:func:`p_values`).
    """
    tests = []
    if shift == "clean":
        tests = [
            (f, h)
            for f, h in (
                ("spiegelhalter_p", "ece p (Spiegelhalter)"),
                ("ece_consistency_p", "ece p (consistency)"),
            )
            if _has(rows, f)
        ]
    header, body = ["method"], []
    for k in ALL_METRICS:
        header += [k] + ([h for _, h in tests] if k == "ece" else [])
    for m in agg.methods(rows):
        cells = [m]
        for k in ALL_METRICS:
            cells.append(agg.fmt(*agg.aggregate(rows, m, calibrator, k, shift), k))
            if k == "ece":
                cells += [p_values(rows, m, calibrator, f) for f, _ in tests]
        body.append(cells)
    return markdown(header, body)


def calibration_tests_table(rows, num_bins: int = 15) -> list[str]:
    """ECE with its calibration tests' p-values, per method x calibrator.

    Clean test set: the ECE (mean ± SEM) and, one per seed, the p-values of
    Spiegelhalter's Z test and of the ECE's consistency resampling; on a grid
    with shifted sets, the share of them whose Spiegelhalter p-value is below
    :data:`LEVEL`. Empty when the rows carry no tests. ``num_bins``: the
    ECE's bins (``config.num_bins``), named in the text.
    """
    if not _has(rows, "spiegelhalter_p"):
        return []
    shifted = agg.has_shift(rows)
    consistency = _has(rows, "ece_consistency_p")
    header = ["method", "calibrator", "ECE", "p (Spiegelhalter)"]
    header += ["p (consistency)"] if consistency else []
    header += [f"shifted sets with Spiegelhalter p < {LEVEL:g}"] if shifted else []
    body = []
    for method in agg.methods(rows):
        for cal in agg.calibrators(rows):
            cells = [method, cal, agg.fmt(*agg.aggregate(rows, method, cal, "ece"))]
            cells.append(p_values(rows, method, cal, "spiegelhalter_p"))
            if consistency:
                cells.append(p_values(rows, method, cal, "ece_consistency_p"))
            if shifted:
                cells.append(agg.fmt(*rejected(rows, method, cal, "spiegelhalter_p")))
            body.append(cells)
    seeds = sorted({r["seed"] for r in rows})
    return [
        "## Calibration tests (clean test set)",
        "",
        (
            "Is the calibration error distinguishable from sampling noise? "
            "`p (Spiegelhalter)`: Spiegelhalter's (1986) Z test of the top-label "
            "confidence against correctness (`calib_jax.metrics.spiegelhalter_test`, "
            f"two-sided); `p (consistency)`: the share of the ECE's values ({num_bins} "
            "equal-width bins, l1) under perfect calibration, by consistency "
            "resampling (Broecker & Smith 2007; `calib_jax.metrics."
            "ece_consistency_test`, a fixed key per cell), at least as large as "
            f"the measured ECE. One p-value per seed ({', '.join(map(str, seeds))}"
            "), in that order; a small p-value says the model is miscalibrated "
            "beyond what the test set's size explains. "
            + (
                "The last column is the share of shifted sets (percent, mean ± "
                f"SEM over seeds) whose Spiegelhalter p-value is below {LEVEL:g}."
                if shifted
                else ""
            )
        ),
        "",
        *markdown(header, body),
        "",
    ]


# The calibrators of the CORP table, when the rows have them.
CORP_CALIBRATORS = ("none", "ts:nll")


def corp_table(rows) -> list[str]:
    """The CORP decomposition of the Brier and log scores per method (clean).

    One row per method x calibrator of :data:`CORP_CALIBRATORS`: score,
    miscalibration (MCB), discrimination (DSC) and uncertainty (UNC), score =
    MCB - DSC + UNC, each mean ± SEM over seeds. Empty when the rows carry no
    decomposition.
    """
    if not _has(rows, "corp_brier_mcb"):
        return []
    cals = [c for c in CORP_CALIBRATORS if c in set(agg.calibrators(rows))]
    names = {"score": "", "mcb": " MCB", "dsc": " DSC", "unc": " UNC"}
    header = ["method", "calibrator"] + [
        f"{score.capitalize()}{names[part]}"
        for score in evaluate.CORP_SCORES
        for part in evaluate.CORP_PARTS
    ]
    body = []
    for method in agg.methods(rows):
        for cal in cals:
            cells = [method, cal]
            for score in evaluate.CORP_SCORES:
                for part in evaluate.CORP_PARTS:
                    m, e = _present(rows, method, cal, f"corp_{score}_{part}")
                    cells.append("-" if math.isnan(m) else f"{m:.4f} ± {e:.4f}")
            body.append(cells)
    return [
        "## CORP decomposition of the Brier and log scores (clean test)",
        "",
        (
            "Dimitriadis, Gneiting & Jordan (2021): the top-label score (the "
            "confidence against correctness) splits into miscalibration MCB "
            "(the score's excess over the isotonic (PAV) recalibration of the "
            "confidences), discrimination DSC (what the recalibrated "
            "confidences gain over the constant accuracy) and uncertainty UNC "
            "(the score of that constant): score = MCB - DSC + UNC "
            "(`calib_jax.metrics.corp_decomposition`). Mean ± SEM over seeds, "
            "as values of the score (log: natural log)."
        ),
        "",
        *markdown(header, body),
        "",
    ]


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
    """OOD detection scores per method x calibrator (clean rows; [] without them).

    The maximum softmax probability's four metrics, then, when the rows carry
    them, the AUROC and the FPR at 95% TPR of every OOD score of
    :data:`calib_jax.benchmark.evaluate.OOD_SCORES` (``-`` where a row has no
    such score: mutual information needs an ensemble or MC dropout).
    """
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
    out = [
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
    scores = [
        s
        for s in evaluate.OOD_SCORES
        if any(evaluate.ood_field(s, "auroc") in r for r in clean)
    ]
    if scores == ["msp"]:
        return out
    short = {"auroc": "AUROC", "fpr_at_95_tpr": "FPR95"}
    header = ["method", "calibrator"] + [
        f"{s} {short[k]}" for k in short for s in scores
    ]
    body = [
        [method, cal]
        + [
            agg.fmt(*_present(rows, method, cal, evaluate.ood_field(s, k)))
            for k in short
            for s in scores
        ]
        for method in agg.methods(rows)
        for cal in agg.calibrators(rows)
    ]
    return out + [
        f"## OOD detection by every score{name}",
        "",
        (
            "AUROC and FPR at 95% TPR (percent, mean ± SEM over seeds) of each "
            "OOD score of the calibrated logits (`calib_jax.metrics.ood_score`; "
            "higher = in-distribution): "
            + "; ".join(f"`{s}` = {evaluate.OOD_SCORES[s]}" for s in scores)
            + ". AUPR-In and AUPR-Out of every score are in `results.jsonl` "
            "(`ood_<score>_aupr_in`, `ood_<score>_aupr_out`). An ensemble's and "
            "MC dropout's logits are log mean probabilities, whose logsumexp is "
            "0: without a calibrator their energy is 0 up to float32 rounding, so "
            "its AUROC measures the rounding, not the model, and their max logit "
            "ranks as the MSP. Mutual information is computed "
            "from the members' (or dropout samples') own logits, before any "
            "calibrator, so it is the same under every calibrator."
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


def bootstrap_table(rows, confidence: float = 0.95, num_bins: int = 15) -> list[str]:
    """Per-cell bootstrap intervals of the first seed's clean test set.

    One row per method x calibrator: ``value [lo, hi]`` of every metric of
    :data:`calib_jax.benchmark.evaluate.BOOTSTRAP_METRICS`. Empty when the
    rows carry no intervals. ``num_bins``: the ECEs' bins, named in the text.
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
            + "; ".join(f"`{m}` = {evaluate.describe(m, num_bins)}" for m in names)
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
