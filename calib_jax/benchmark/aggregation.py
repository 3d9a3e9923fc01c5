"""Aggregation of benchmark rows: per-seed values, mean ± SEM, paired differences.

Every number of the report follows these rules, and this module is the one
place they are written:

- a *clean* value is the metric on the test set;
- a *shifted* value of one seed is the mean over every corruption x severity
  set; a value *at severity s* is the mean over corruption types at s;
- mean +/- SEM are over seeds (sample std with ddof=1, divided by sqrt(n)).
  Averaging over corruption types before taking the SEM removes the
  variability due to the type of corruption from the error bar, which is the
  correction the soft-calibration paper applies to its Fig. 2 error bars;
- a difference between two (method, calibrator) pairs is paired by seed, and
  its verdict compares it with its SEM (:func:`verdict`).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


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


def select(rows, method: str, calibrator: str) -> list[dict]:
    """The rows of ``method`` (``'*'``: every method) under ``calibrator``."""
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
    for r in select(rows, method, calibrator):
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


def has_shift(rows) -> bool:
    """Whether any row is of a shifted set."""
    return any(r["shift"] != "clean" for r in rows)


def methods(rows) -> list[str]:
    """The training methods of ``rows``, in first-seen order."""
    return list(dict.fromkeys(r["method"] for r in rows))


def calibrators(rows) -> list[str]:
    """The calibrators of ``rows``, in first-seen order."""
    return list(dict.fromkeys(r["calibrator"] for r in rows))


def best(rows, among, metric: str = "ece", calibrator: str = "none") -> str:
    """The method of ``among`` with the lowest mean clean ``metric`` (first on ties)."""
    return min(among, key=lambda m: aggregate(rows, m, calibrator, metric)[0])


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
    """``holds`` when every difference (claimed < 0) is below 0 by more than
    :func:`detectable` (2 x its paired SEM).

    ``does not hold`` when any is above 0 by more than its detectable
    difference; otherwise ``cannot tell on this grid`` (some difference lies
    within the seeds' noise).
    """
    if not diffs:
        return "not measured"
    if any(d - detectable((d, s)) > 0 for d, s in diffs):
        return "does not hold"
    if all(d + detectable((d, s)) < 0 for d, s in diffs):
        return "holds"
    return "cannot tell on this grid"


def detectable(d: tuple[float, float]) -> float:
    """The smallest difference the seeds could detect: 2 x the paired SEM.

    A true difference smaller than this is, on this grid, indistinguishable
    from seed noise: :func:`verdict` reads ``cannot tell`` below it.
    """
    return 2.0 * d[1]


def wins(rows, a: str, b: str, metric: str, shift) -> str:
    """``'lower for i of n methods'``: calibrator ``a`` against ``b``, seed means."""
    ms = methods(rows)
    count = sum(
        aggregate(rows, m, a, metric, shift)[0]
        < aggregate(rows, m, b, metric, shift)[0]
        for m in ms
    )
    return f"lower for {count} of {len(ms)} methods"
