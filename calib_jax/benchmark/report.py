"""The benchmark report: rows in, ``report.md``, its tables, claims and plots out.

The report reads rows only: the result rows (``results.jsonl``) and the
reliability rows (``reliability.jsonl``), both written by the runner from each
cell's evaluation (:func:`calib_jax.benchmark.evaluate.cell_results`). It is
assembled from three parts:

- :mod:`.aggregation`: per-seed values, mean ± SEM over seeds, paired
  differences and verdicts (the aggregation rules are written there);
- :mod:`.paper_claims`: the papers' headline claims as a data table;
- :mod:`.tables` and :mod:`.figures`: the markdown tables and the PNG plots.

Numbers are printed in percent with two decimals.
"""

from __future__ import annotations

import re

from etils import epath
from ml_collections import ConfigDict

from calib_jax import posthoc, storage
from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import evaluate, paper_claims, tables
from calib_jax.benchmark import figures as figures_lib

REPORT_FILE = "report.md"


def figures(markdown: str) -> list[str]:
    """The image files a report embeds (``![...](name)``), in order."""
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def read_reliability(workdir: epath.Path) -> list[dict]:
    """The reliability rows of ``workdir`` (``[]`` when it has none)."""
    path = workdir / evaluate.RELIABILITY_FILE
    if not path.exists():
        return []
    return storage.read_jsonl(path)


def claim_rows(rows) -> list[dict]:
    """The rows :func:`.paper_claims.claims` reads, one per seed and set kind.

    For every (method, calibrator) and seed: a ``'clean'`` row and, on a grid
    with shifted sets, an ``'all'`` row holding the mean over that seed's
    shifted sets (:func:`.aggregation.per_seed`), each with the metrics the
    claims compare and the accuracy their notes quote. ``claims`` gives the
    same entries on these rows as on ``rows``, from two rows per method,
    calibrator and seed instead of one per set: the README's claims summary is
    re-derived from them (``tests/benchmark/expected/demo``).
    """
    rows = rows if isinstance(rows, agg.Rows) else agg.Rows(rows)
    metrics = sorted({c.metric for c in paper_claims.CLAIMS} | {"accuracy"})
    shifts = [("clean", 0)] + ([("all", None)] if agg.has_shift(rows) else [])
    out = []
    for (method, calibrator), group in rows.groups.items():
        if method == "*":
            continue
        values = {
            (shift, m): agg.per_seed(group, method, calibrator, m, shift)
            for shift, _ in shifts
            for m in metrics
        }
        for shift, severity in shifts:
            for seed in values[shift, metrics[0]]:
                row = {"method": method, "calibrator": calibrator, "seed": seed}
                row |= {"shift": shift, "severity": severity}
                out.append(row | {m: values[shift, m][seed] for m in metrics})
    return out


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def claims_summary(entries, run: dict) -> list[str]:
    """The README's claims summary: one line naming the run, then the claims table.

    Args:
      entries: :func:`.paper_claims.claims` of the run's rows.
      run: ``config``, ``dataset``, ``model``, ``num_epochs``, ``methods``,
        ``calibrators`` (counts), ``seeds``, ``results_sha256`` (of its
        ``results.jsonl``) and, when the run was timed, ``wall_seconds``,
        ``cpus`` and ``load_average`` (at its start).
    """
    timed = ""
    if run.get("wall_seconds") is not None:
        timed = (
            f"; {_duration(run['wall_seconds'])} on {run['cpus']} CPU cores, "
            f"load average {run['load_average']:.2f} at the start"
        )
    seeds = ", ".join(str(s) for s in run["seeds"])
    epochs = f"{run['num_epochs']:g}"
    return [
        (
            f"From one `make demo` run (`{run['config']}`: {run['methods']} methods "
            f"x {run['calibrators']} calibrators x seeds {seeds}, `{run['model']}` "
            f"on `{run['dataset']}`, {epochs} epochs{timed}; `results.jsonl` "
            f"sha256 `{run['results_sha256']}`), the report's *Claims* table:"
        ),
        "",
        *tables.claims_table(entries),
    ]


def write_report(
    config: ConfigDict, workdir: epath.PathLike, rows, reliability=None
) -> epath.Path:
    """Writes ``report.md`` and the PNG plots under ``workdir``; returns the path.

    Args:
      config: the benchmark config.
      workdir: the benchmark's directory.
      rows: the result rows.
      reliability: the reliability rows (None: those of ``workdir``'s
        ``reliability.jsonl``, if any); a reliability diagram without its
        row is left out.
    """
    workdir = storage.as_path(workdir)
    rows = rows if isinstance(rows, agg.Rows) else agg.Rows(rows)
    if reliability is None:
        reliability = read_reliability(workdir)
    seeds = sorted({r["seed"] for r in rows})
    shifts = sorted({r["shift"] for r in rows if r["shift"] != "clean"})
    t = config.train
    bins = int(config.num_bins)
    lines = [
        "# Calibration benchmark",
        "",
        (
            f"Dataset `{t.dataset.name}`, model `{t.model.name}`, "
            f"{len(agg.methods(rows))} training methods x {len(agg.calibrators(rows))} "
            f"post-hoc calibrators x seeds {seeds}; clean test set and "
            f"{len(shifts)} shifted test sets (corruption x severity). "
            f"Every number is mean ± SEM over seeds, in percent; a shifted value is "
            f"first averaged over all corruption x severity sets of its seed. "
            f"Calibrators are fitted on the validation split. "
            f"All figures are recomputed from `results.jsonl` (the reliability "
            f"diagrams from `reliability.jsonl`) by `calib_jax.benchmark.report`."
        ),
        "",
        f"## Table 2 layout (soft-calibration paper): ECE with {bins} equal-mass "
        "bins, l2",
        "",
        *tables.table2(rows, "ece_l2_em"),
        "",
        (
            f"## Table 2 layout: ECE with {bins} equal-width bins, l1 (focal, ACLS, "
            "reweighted-risk papers)"
        ),
        "",
        *tables.table2(rows, "ece"),
        "",
        "## Every metric, no post-hoc calibration (clean test)",
        "",
        "Conventions: "
        + "; ".join(f"`{k}` = {evaluate.describe(k, bins)}" for k in evaluate.METRICS)
        + (
            "; `ece p (...)` = the p-values of the ECE's calibration tests, one "
            "per seed (see *Calibration tests*)"
            if any("spiegelhalter_p" in r for r in rows)
            else ""
        )
        + ".",
        "",
        *tables.metrics_table(rows, "none"),
        "",
    ]
    if shifts:
        lines += [
            "## Every metric, no post-hoc calibration (shifted, mean over sets)",
            "",
            *tables.metrics_table(rows, "none", "all"),
            "",
        ]
    skipped = [
        c
        for c in config.get("calibrators", ())
        if c in posthoc.BINARY_ONLY and c not in set(agg.calibrators(rows))
    ]
    lines += [
        (
            f"## ECE ({bins} equal-width bins, l1) of every method under every "
            "calibrator "
            "(clean test)"
        ),
        "",
        *tables.calibrator_table(rows, "ece"),
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
            f"## ECE ({bins} equal-width bins, l1) under every calibrator (shifted)",
            "",
            *tables.calibrator_table(rows, "ece", "all"),
            "",
        ]
    lines += tables.calibration_tests_table(rows, bins)
    lines += tables.corp_table(rows)
    boot, ood = config.get("bootstrap"), t.get("ood")
    lines += tables.bootstrap_table(
        rows, float(boot.confidence) if boot else 0.95, num_bins=bins
    )
    lines += tables.ood_table(rows, ood.dataset if ood else "")
    lines += tables.conformal_table(rows)
    lines += [
        "## Claims",
        "",
        (
            "Each paper's headline claim, tested on this grid. Differences are "
            "paired by seed (method minus baseline, percentage points). The "
            "smallest difference the seeds could detect is 2 x the paired SEM; a "
            "claim holds when every difference is below 0 by more than that, does "
            "not hold when one is above 0 by more than that, and otherwise this "
            "grid cannot tell. Claims that come "
            "from a released number use the released-code methods "
            "(`acls_released`, `au_pxtau_released`)."
        ),
        "",
        *tables.claims_table(paper_claims.claims(rows, num_bins=bins)),
        "",
        "## Plots",
        "",
        *figures_lib.write_figures(
            workdir,
            rows,
            reliability,
            seed=min(config.seeds),
            options=config.get("report") or {},
            num_bins=bins,
        ),
        "",
    ]
    path = workdir / REPORT_FILE
    storage.write_text(path, "\n".join(lines))
    return path
