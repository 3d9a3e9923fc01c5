"""The PNG figures of the benchmark report, drawn from result and reliability rows.

ECE against shift severity (the highlighted methods, and every method against
the baseline), accuracy against ECE, and the reliability diagrams of the
baseline and of the method with the lowest clean ECE. Every figure is drawn
from rows (``results.jsonl`` and ``reliability.jsonl``): nothing here reads a
cell's files.
"""

from __future__ import annotations

import numpy as np
from etils import epath

from calib_jax import plots
from calib_jax.benchmark import aggregation as agg

# dtypes of the per-bin fields of a reliability row, as
# :func:`calib_jax.metrics.reliability_bins` returns them.
BIN_DTYPES = {
    "count": np.int32,
    "confidence": np.float32,
    "accuracy": np.float32,
    "lower": np.float32,
    "upper": np.float32,
}


def highlighted(methods, baseline: str, best: str, named) -> list[str]:
    """The methods of the single-panel severity plot, in ``methods`` order.

    The baseline, the method with the best clean ECE and the ``named`` ones
    that ran (``config.report.methods``).
    """
    keep = {baseline, best, *named}
    return [m for m in methods if m in keep]


def find_row(rows, **key) -> dict | None:
    """The first of ``rows`` whose fields equal ``key`` (None if none does)."""
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


def bins_of(row: dict) -> dict[str, np.ndarray]:
    """The per-bin arrays of a reliability row, in the dtypes of the metric."""
    return {k: np.asarray(row[k], dtype) for k, dtype in BIN_DTYPES.items()}


def write_figures(
    workdir: epath.Path,
    rows,
    reliability,
    *,
    seed: int,
    options,
    num_bins: int = 15,
) -> list[str]:
    """Writes the PNGs under ``workdir``; returns their markdown lines.

    Args:
      workdir: the benchmark's directory.
      rows: result rows.
      reliability: reliability rows
        (:func:`calib_jax.benchmark.evaluate.cell_results`); a diagram whose
        row is missing is left out.
      seed: the seed of the reliability diagrams.
      options: ``config.report`` (``methods``, ``min_count``).
      num_bins: the bins of the ECE (``config.num_bins``), named on the axes.
    """
    lines = []
    methods = agg.methods(rows)
    baseline = "ce" if "ce" in methods else methods[0]
    best = agg.best(rows, methods)
    if agg.has_shift(rows):
        severities = sorted({r["severity"] for r in rows})
        curves = {
            m: {
                s: list(agg.per_seed(rows, m, "none", "ece", s).values())
                for s in severities
            }
            for m in methods
        }
        chosen = highlighted(methods, baseline, best, options.get("methods", ()))
        metric = f"ECE ({num_bins} equal-width bins, l1)"
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
        acc = agg.aggregate(rows, m, "none", "accuracy")
        err = agg.aggregate(rows, m, "none", "ece")
        points[m] = (*acc, *err)
    plots.accuracy_vs_ece(
        points,
        ece_name=f"ECE, clean test ({num_bins} equal-width bins, l1)",
        title="Accuracy vs ECE (mean ± SEM over seeds)",
        path=workdir / "accuracy_vs_ece.png",
    )
    lines.append("![accuracy vs ECE](accuracy_vs_ece.png)")
    # Reliability diagrams: the baseline (ce, or the first method) and the
    # method with the lowest clean ECE, on the first seed's test set; bins
    # with fewer than report.min_count samples are greyed out.
    min_count = int(options.get("min_count", 10))
    for tag, method in (("baseline", baseline), ("best", best)):
        key = {"method": method, "calibrator": "none", "seed": seed, "shift": "clean"}
        bins = find_row(reliability, **key)
        if bins is None:
            continue
        name = f"reliability_{tag}.png"
        plots.reliability_diagram_of_bins(
            bins_of(bins),
            ece=bins["ece"],
            min_count=min_count,
            title=f"{method} (seed {seed}, clean test)",
            path=workdir / name,
        )
        lines.append(f"![reliability, {tag}: {method}]({name})")
    # One paragraph per figure (adjacent image lines would render in a row).
    return [part for line in lines for part in (line, "")]
