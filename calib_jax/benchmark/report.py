"""The benchmark report: results.jsonl rows in, report.md tables, claims and plots out.

Aggregation (every number in the report follows it, and ``aggregate`` is the
one place it is written):

- a *clean* value is the metric on the test set;
- a *shifted* value of one seed is the mean over every corruption x severity
  set; a value *at severity s* is the mean over corruption types at s;
- mean +/- SEM are over seeds (sample std with ddof=1, divided by sqrt(n)).
  Averaging over corruption types before taking the SEM removes the
  variability due to the type of corruption from the error bar, which is the
  correction the soft-calibration paper applies to its Fig. 2 error bars.

Numbers are printed in percent with two decimals.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np
from etils import epath
from ml_collections import ConfigDict

from calib_jax import storage
from calib_jax.benchmark import conformal_sets, evaluate, grid

REPORT_FILE = "report.md"
# The columns of the soft-calibration paper's Table 2.
TABLE2 = (
    ("Accuracy", "none", "accuracy"),
    ("ECE", "none", None),
    ("ECE+TS", "ts:nll", None),
    ("ECE+TS-SB-ECE", "ts:sb_ece", None),
)
ALL_METRICS = tuple(evaluate.METRICS)


class Rows(list):
    """Result rows with an index by ``(method, calibrator)``, built once.

    The report asks for hundreds of aggregates; indexing avoids a scan of
    every row for each of them. Plain lists work too (they are scanned).
    """

    def __init__(self, rows=()):
        super().__init__(rows)
        self.groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for r in self:
            self.groups[r["method"], r["calibrator"]].append(r)
            self.groups["*", r["calibrator"]].append(r)


def _select(rows, method: str, calibrator: str):
    if isinstance(rows, Rows):
        return rows.groups.get((method, calibrator), [])
    return [
        r
        for r in rows
        if method in ("*", r["method"]) and r["calibrator"] == calibrator
    ]


def per_seed(rows, method, calibrator, metric, shift="clean") -> dict[int, float]:
    """``{seed: value}`` for one method, calibrator and metric.

    ``shift``: ``'clean'``, ``'all'`` (mean over every shifted set) or an int
    severity (mean over corruption types at that severity; 0 is clean).
    ``method='*'`` averages over every training method.
    """
    acc: dict[int, list[float]] = defaultdict(list)
    for r in _select(rows, method, calibrator):
        if shift == "clean" or shift == 0:
            keep = r["shift"] == "clean"
        elif shift == "all":
            keep = r["shift"] != "clean"
        else:
            keep = r["severity"] == shift and r["shift"] != "clean"
        if keep:
            acc[r["seed"]].append(r[metric])
    return {s: float(np.mean(v)) for s, v in sorted(acc.items())}


def mean_sem(values) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for a single value)."""
    v = np.asarray(list(values), np.float64)
    if v.size == 0:
        return math.nan, math.nan
    sem = v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else 0.0
    return float(v.mean()), float(sem)


def aggregate(rows, method, calibrator, metric, shift="clean") -> tuple[float, float]:
    """Mean +/- SEM over seeds of :func:`per_seed`."""
    return mean_sem(per_seed(rows, method, calibrator, metric, shift).values())


# Metrics printed as they are (not in percent).
RAW = ("nll",)


def fmt(mean: float, sem: float, metric: str = "") -> str:
    """``'1.23 ± 0.05'`` in percent (NLL as is, 3 decimals); ``'-'`` if missing."""
    if math.isnan(mean):
        return "-"
    if metric in RAW:
        return f"{mean:.3f} ± {sem:.3f}"
    return f"{100 * mean:.2f} ± {100 * sem:.2f}"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return out


def _has_shift(rows) -> bool:
    return any(r["shift"] != "clean" for r in rows)


def _methods(rows) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in rows))


def _calibrators(rows) -> list[str]:
    return list(dict.fromkeys(r["calibrator"] for r in rows))


def table2(rows, metric: str) -> list[str]:
    """Soft-calibration Table 2 layout for one ECE convention (clean, then shifted)."""
    cals = set(_calibrators(rows))
    cols = [(n, c, m or metric) for n, c, m in TABLE2 if c in cals]
    shifts = ["clean"] + (["all"] if _has_shift(rows) else [])
    header = ["method"] + [
        f"{name} ({'clean' if s == 'clean' else 'shifted'})"
        for s in shifts
        for name, _, _ in cols
    ]
    body = []
    for method in _methods(rows):
        body.append(
            [method]
            + [
                fmt(*aggregate(rows, method, cal, m, s))
                for s in shifts
                for _, cal, m in cols
            ]
        )
    return _table(header, body)


def metrics_table(rows, calibrator: str, shift="clean") -> list[str]:
    """Every metric of every method under one calibrator."""
    header = ["method"] + list(ALL_METRICS)
    body = [
        [m] + [fmt(*aggregate(rows, m, calibrator, k, shift), k) for k in ALL_METRICS]
        for m in _methods(rows)
    ]
    return _table(header, body)


def calibrator_table(rows, metric: str, shift="clean") -> list[str]:
    """``metric`` of every method (rows) under every calibrator (columns)."""
    cals = _calibrators(rows)
    body = [
        [m] + [fmt(*aggregate(rows, m, c, metric, shift)) for c in cals]
        for m in _methods(rows)
    ]
    return _table(["method"] + cals, body)


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
    shifted = _has_shift(rows)
    header = ["method", "calibrator"]
    for m in conformal_sets.METHODS:
        header += [f"{m.upper()} coverage", f"{m.upper()} size"]
        header += [f"{m.upper()} coverage (shifted)"] if shifted else []
    body = []
    for method in _methods(rows):
        for cal in _calibrators(rows):
            cells = [method, cal]
            for m in conformal_sets.METHODS:
                cov = conformal_sets.field(m, "coverage")
                size = aggregate(rows, method, cal, conformal_sets.field(m, "size"))
                cells.append(fmt(*aggregate(rows, method, cal, cov)))
                cells.append(
                    "-" if math.isnan(size[0]) else f"{size[0]:.2f} ± {size[1]:.2f}"
                )
                if shifted:
                    cells.append(fmt(*aggregate(rows, method, cal, cov, "all")))
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
        *_table(header, body),
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
        [method, cal] + [fmt(*aggregate(rows, method, cal, f)) for f in fields]
        for method in _methods(rows)
        for cal in _calibrators(rows)
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
        *_table(header, body),
        "",
    ]


def _interval(row: dict, metric: str) -> str:
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None:
        return "-"
    if metric in RAW:
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
    for method in _methods(rows):
        for cal in _calibrators(rows):
            row = cell.get((method, cal))
            if row is not None:
                body.append([method, cal] + [_interval(row, m) for m in names])
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
        *_table(["method", "calibrator", *names], body),
        "",
    ]


# ---------------------------------------------------------------------------
# Claims.
# ---------------------------------------------------------------------------


def paired(rows, a, b, metric, shift="clean") -> tuple[float, float] | None:
    """Mean +/- SEM over seeds of ``a - b``; ``a`` and ``b`` are (method, calibrator).

    None when the two share no seed.
    """
    va = per_seed(rows, *a, metric, shift)
    vb = per_seed(rows, *b, metric, shift)
    common = sorted(set(va) & set(vb))
    if not common:
        return None
    return mean_sem([va[s] - vb[s] for s in common])


def verdict(diffs: list[tuple[float, float]]) -> str:
    """``holds`` when every difference (claimed < 0) is below 0 by more than its SEM.

    ``does not hold`` when any is above 0 by more than its SEM; otherwise
    ``cannot tell on this grid`` (some difference within one SEM of 0: the
    seeds cannot resolve it; see :func:`detectable`).
    """
    if not diffs:
        return "not measured"
    if any(d - s > 0 for d, s in diffs):
        return "does not hold"
    if all(d + s < 0 for d, s in diffs):
        return "holds"
    return "cannot tell on this grid (within 1 SEM)"


def detectable(d: tuple[float, float]) -> float:
    """The smallest difference the seeds could detect: 2 x the paired SEM.

    A true difference smaller than this is, on this grid, indistinguishable
    from seed noise; a claim whose verdict is ``cannot tell`` says nothing
    about differences below it.
    """
    return 2.0 * d[1]


def _diff_text(label: str, d: tuple[float, float]) -> str:
    return f"{label} {100 * d[0]:+.2f} ± {100 * d[1]:.2f}"


def _wins(rows, a: str, b: str, metric: str, shift) -> str:
    """``'lower for i of n methods'``: calibrator ``a`` against ``b``, seed means."""
    ms = _methods(rows)
    wins = sum(
        aggregate(rows, m, a, metric, shift)[0]
        < aggregate(rows, m, b, metric, shift)[0]
        for m in ms
    )
    return f"lower for {wins} of {len(ms)} methods"


def claims(rows) -> list[dict]:
    """One entry per headline claim: paper, claim, measured text, verdict.

    Differences are paired by seed (method minus baseline, in percentage
    points of ECE); a claim holds when each is negative by more than its SEM.
    """
    methods, cals = set(_methods(rows)), set(_calibrators(rows))
    has_shift = _has_shift(rows)
    out = []

    def entry(paper, claim, metric, shift, pairs, note=""):
        """``pairs``: (label, (method, cal), (method, cal)[, shift])."""
        diffs, texts, resolution = [], [], []
        for label, a, b, *where in pairs:
            on = where[0] if where else shift
            known = methods | {"*"}
            if a[0] in known and b[0] in known and a[1] in cals and b[1] in cals:
                d = paired(rows, a, b, metric, on)
                if d is not None:
                    diffs.append(d)
                    texts.append(_diff_text(label, d))
                    resolution.append(f"{label} {100 * detectable(d):.2f}")
        measured = "; ".join(texts) if texts else "methods not in this grid"
        out.append(
            dict(
                paper=paper,
                claim=claim,
                metric=evaluate.METRICS[metric],
                measured=measured + (f" ({note})" if note and texts else ""),
                detectable="; ".join(resolution) if resolution else "-",
                verdict=verdict(diffs),
            )
        )

    soft_names = ("s_avuc", "sb_ece", "interleaved_sb_ece")
    soft = [m for m in soft_names if m in methods]
    others = [m for m in _methods(rows) if m not in soft_names]
    if soft and others:
        best_soft = min(soft, key=lambda m: aggregate(rows, m, "none", "ece_l2_em")[0])
        best_other = min(
            others, key=lambda m: aggregate(rows, m, "none", "ece_l2_em")[0]
        )
        pairs = [
            (f"{best_soft} - {best_other}", (best_soft, "none"), (best_other, "none"))
        ]
    else:
        pairs = []
    entry(
        "Soft calibration objectives (Karandikar et al. 2021)",
        "S-AvUC / SB-ECE (as secondary or interleaved losses) give the lowest ECE "
        "among trained methods",
        "ece_l2_em",
        "clean",
        pairs,
    )
    shift = "all" if has_shift else "clean"
    entry(
        "Soft calibration objectives (Karandikar et al. 2021)",
        "TS fitted by SB-ECE beats TS fitted by NLL, mostly under shift "
        "(per training method)",
        "ece_l2_em",
        shift,
        [("shifted: TS-SB-ECE - TS", ("*", "ts:sb_ece"), ("*", "ts:nll"))],
        note=_wins(rows, "ts:sb_ece", "ts:nll", "ece_l2_em", shift)
        + "; clean: "
        + _wins(rows, "ts:sb_ece", "ts:nll", "ece_l2_em", "clean"),
    )
    # The published ACLS numbers come from the authors' code with its lambda
    # values: the claim is tested with acls_released where the grid has it.
    acls_m = "acls_released" if "acls_released" in methods else "acls"
    acls_rivals = ("ls", "focal", "mbls", "mdca", "cpc")
    entry(
        "ACLS (Park et al. 2023)",
        "ACLS has lower ECE than LS, focal, MbLS, MDCA and CPC"
        + (" (released code: `acls_released`)" if acls_m != "acls" else ""),
        "ece",
        "clean",
        [(f"{acls_m} - {b}", (acls_m, "none"), (b, "none")) for b in acls_rivals],
        note="accuracy "
        + ", ".join(
            f"{m} {fmt(*aggregate(rows, m, 'none', 'accuracy'))}"
            for m in (acls_m, *acls_rivals)
            if m in methods
        ),
    )
    if acls_m != "acls":
        entry(
            "ACLS as the paper's Eq. (13) (`acls`)",
            "the same claim with the paper's Eq. (13) and the same lambdas",
            "ece",
            "clean",
            [(f"acls - {b}", ("acls", "none"), (b, "none")) for b in acls_rivals],
        )
    entry(
        "Class-wise loss scaling (Jung et al.)",
        "class-wise loss scaling lowers the ECE of TS, ETS, PTS and CTS",
        "ece",
        "clean",
        [
            (f"{b}+classwise - {b}", ("*", f"{b}+classwise"), ("*", base))
            for b, base in (
                ("ts", "ts:nll"),
                ("ets", "ets"),
                ("pts", "pts"),
                ("cts", "cts"),
            )
        ],
    )
    entry(
        "MaC-Cal two-stage masked retraining",
        "stage II lowers the ECE of its stage-I (cross-entropy) model, also under corruption",
        "ece",
        "clean",
        [("clean: two_stage - ce", ("two_stage", "none"), ("ce", "none"))]
        + (
            [("shifted: two_stage - ce", ("two_stage", "none"), ("ce", "none"), "all")]
            if has_shift
            else []
        ),
    )
    # The published AU_Pxτ numbers come from the authors' code (its score on
    # softmax(softmax(z))): the claim is tested with au_pxtau_released where
    # the grid has it, and the paper's equations get their own row.
    au_m = "au_pxtau_released" if "au_pxtau_released" in methods else "au_pxtau"
    entry(
        "Reweighted risk, AU_Pxτ (Zhou et al.)",
        "AU_Pxτ has lower ECE than cross-entropy, focal and AURC"
        + (" (released code: `au_pxtau_released`)" if au_m != "au_pxtau" else ""),
        "ece",
        "clean",
        [
            (f"{au_m} - {b}", (au_m, "none"), (b, "none"))
            for b in ("ce", "focal", "aurc")
        ],
        note="accuracy "
        + ", ".join(
            f"{m} {fmt(*aggregate(rows, m, 'none', 'accuracy'))}"
            for m in (au_m, "ce")
            if m in methods
        ),
    )
    if au_m != "au_pxtau":
        entry(
            "AU_Pxτ as the paper's Eqs. (16)-(17) and (27) (`au_pxtau`)",
            "the same claim with the paper's equations",
            "ece",
            "clean",
            [
                (f"au_pxtau - {b}", ("au_pxtau", "none"), (b, "none"))
                for b in ("ce", "focal", "aurc")
            ],
        )
    entry(
        "AU_Pxτ with constant weights (`weight_grad=False`; not the paper's Eq. (27))",
        "the same claim when the weights carry no gradient",
        "ece",
        "clean",
        [
            (f"au_pxtau_stopgrad - {b}", ("au_pxtau_stopgrad", "none"), (b, "none"))
            for b in ("ce", "focal", "aurc")
        ],
    )
    return out


# ---------------------------------------------------------------------------
# The report file and its plots.
# ---------------------------------------------------------------------------


def _plots(config: ConfigDict, workdir: epath.Path, rows) -> list[str]:
    """Writes the PNGs; returns their markdown lines."""
    from calib_jax import plots  # matplotlib, imported only here

    lines = []
    methods = _methods(rows)
    options = config.get("report") or {}
    baseline = "ce" if "ce" in methods else methods[0]
    best = min(methods, key=lambda m: aggregate(rows, m, "none", "ece")[0])
    if _has_shift(rows):
        severities = sorted({r["severity"] for r in rows})
        curves = {
            m: {
                s: list(per_seed(rows, m, "none", "ece", s).values())
                for s in severities
            }
            for m in methods
        }
        chosen = highlighted(methods, baseline, best, options.get("methods", ()))
        metric = "ECE (15 equal-width bins, l1)"
        plots.ece_vs_severity(
            {m: curves[m] for m in chosen},
            metric_name=metric,
            error="sem",
            title=f"ECE vs shift severity: baseline ({baseline}), best, named",
            path=workdir / "ece_vs_severity.png",
        )
        lines.append("![ECE vs severity, chosen methods](ece_vs_severity.png)")
        plots.ece_vs_severity_grid(
            curves,
            reference=baseline,
            metric_name="ECE",
            error="sem",
            title="ECE vs shift severity, every method (mean ± SEM over seeds)",
            path=workdir / "ece_vs_severity_all.png",
        )
        lines.append("![ECE vs severity, every method](ece_vs_severity_all.png)")
    points = {}
    for m in methods:
        acc = aggregate(rows, m, "none", "accuracy")
        err = aggregate(rows, m, "none", "ece")
        points[m] = (*acc, *err)
    plots.accuracy_vs_ece(
        points,
        ece_name="ECE, clean test (15 equal-width bins, l1)",
        title="Accuracy vs ECE (mean ± SEM over seeds)",
        path=workdir / "accuracy_vs_ece.png",
    )
    lines.append("![accuracy vs ECE](accuracy_vs_ece.png)")
    # Reliability diagrams: the baseline (ce, or the first method) and the
    # method with the lowest clean ECE, on the first seed's test set; bins
    # with fewer than report.min_count samples are greyed out.
    import jax

    min_count = int(options.get("min_count", 10))
    seed = min(config.seeds)
    for tag, method in (("baseline", baseline), ("best", best)):
        path = grid.train_dir(workdir, method, seed) / "logits" / "test.npz"
        f = storage.load_npz(path)
        probs = jax.nn.softmax(np.asarray(f["logits"], np.float32), axis=-1)
        labels = np.asarray(f["labels"])
        name = f"reliability_{tag}.png"
        plots.reliability_diagram(
            probs,
            labels,
            num_bins=int(config.num_bins),
            min_count=min_count,
            title=f"{method} (seed {seed}, clean test)",
            path=workdir / name,
        )
        lines.append(f"![reliability, {tag}: {method}]({name})")
    # One paragraph per figure (adjacent image lines would render in a row).
    return [part for line in lines for part in (line, "")]


def highlighted(methods, baseline: str, best: str, named) -> list[str]:
    """The methods of the single-panel severity plot, in ``methods`` order.

    The baseline, the method with the best clean ECE and the ``named`` ones
    that ran (``config.report.methods``).
    """
    keep = {baseline, best, *named}
    return [m for m in methods if m in keep]


def figures(markdown: str) -> list[str]:
    """The image files a report embeds (``![...](name)``), in order."""
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def write_report(config: ConfigDict, workdir: epath.PathLike, rows) -> epath.Path:
    """Writes ``report.md`` and the PNG plots under ``workdir``; returns the path."""
    workdir = storage.as_path(workdir)
    rows = rows if isinstance(rows, Rows) else Rows(rows)
    seeds = sorted({r["seed"] for r in rows})
    shifts = sorted({r["shift"] for r in rows if r["shift"] != "clean"})
    t = config.train
    lines = [
        "# Calibration benchmark",
        "",
        f"Dataset `{t.dataset.name}`, model `{t.model.name}`, "
        f"{len(_methods(rows))} training methods x {len(_calibrators(rows))} "
        f"post-hoc calibrators x seeds {seeds}; clean test set and "
        f"{len(shifts)} shifted test sets (corruption x severity). "
        f"Every number is mean ± SEM over seeds, in percent; a shifted value is "
        f"first averaged over all corruption x severity sets of its seed. "
        f"Calibrators are fitted on the validation split. "
        f"All figures are recomputed from `results.jsonl` by "
        f"`calib_jax.benchmark.report`.",
        "",
        "## Table 2 layout (soft-calibration paper): ECE with 15 equal-mass bins, l2",
        "",
        *table2(rows, "ece_l2_em"),
        "",
        "## Table 2 layout: ECE with 15 equal-width bins, l1 (focal, ACLS, "
        "reweighted-risk papers)",
        "",
        *table2(rows, "ece"),
        "",
        "## Every metric, no post-hoc calibration (clean test)",
        "",
        "Conventions: "
        + "; ".join(f"`{k}` = {v}" for k, v in evaluate.METRICS.items())
        + ".",
        "",
        *metrics_table(rows, "none"),
        "",
    ]
    if shifts:
        lines += [
            "## Every metric, no post-hoc calibration (shifted, mean over sets)",
            "",
            *metrics_table(rows, "none", "all"),
            "",
        ]
    skipped = [
        c
        for c in config.get("calibrators", ())
        if c in grid.posthoc.BINARY_ONLY and c not in set(_calibrators(rows))
    ]
    lines += [
        "## ECE (15 equal-width bins, l1) of every method under every calibrator "
        "(clean test)",
        "",
        *calibrator_table(rows, "ece"),
        "",
    ]
    if skipped:
        note = (
            f"Not run: {', '.join(skipped)} (binary-only calibrators, defined for "
            "K = 2 classes; this dataset has more)."
        )
        lines += [note, ""]
    if shifts:
        lines += [
            "## ECE (15 equal-width bins, l1) under every calibrator (shifted)",
            "",
            *calibrator_table(rows, "ece", "all"),
            "",
        ]
    boot, ood = config.get("bootstrap"), t.get("ood")
    lines += bootstrap_table(rows, float(boot.confidence) if boot else 0.95)
    lines += ood_table(rows, ood.dataset if ood else "")
    lines += conformal_table(rows)
    lines += [
        "## Claims",
        "",
        "Each paper's headline claim, tested on this grid. Differences are "
        "paired by seed (method minus baseline, percentage points); a claim "
        "holds when every difference is below 0 by more than one SEM, does not "
        "hold when one is above 0 by more than one SEM, and otherwise this grid "
        "cannot tell. The smallest detectable difference is 2 x the paired SEM: "
        "differences below it are within the seeds' noise. Claims that come "
        "from a released number use the released-code methods "
        "(`acls_released`, `au_pxtau_released`).",
        "",
        *_table(
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
                for c in claims(rows)
            ],
        ),
        "",
        "## Plots",
        "",
        *_plots(config, workdir, rows),
        "",
    ]
    path = workdir / REPORT_FILE
    storage.write_text(path, "\n".join(lines))
    return path
