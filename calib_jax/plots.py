"""Matplotlib figures: reliability diagrams and ECE against shift severity.

Matplotlib is imported inside the functions (importing calib_jax does not
import it) and figures are drawn on the non-interactive Agg canvas without
touching pyplot's global backend, so the functions work on headless
machines and inside notebooks alike.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

import numpy as np

from calib_jax import metrics, storage

# The greyed-out bins of a reliability diagram (fewer than min_count samples).
LOW_COUNT_COLOR = "#d9d9d9"
LOW_COUNT_LABEL = "< {min_count} samples (noisy)"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _distinct_colors(ax, n: int) -> None:
    """Gives ``ax`` a colour cycle of ``n`` distinct colours (tab10, or tab20 past 10)."""
    from matplotlib import colormaps
    from cycler import cycler

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    ax.set_prop_cycle(cycler(color=[cmap(i % cmap.N) for i in range(max(n, 1))]))


def _save(fig, path: str | os.PathLike | None) -> None:
    """Writes ``fig`` as a PNG to a local path or a ``gs://`` URL."""
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        storage.write_bytes(path, buf.getvalue())  # parses the path


def reliability_diagram(
    probs,
    labels,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    convention: str | metrics.Convention = "calib_jax",
    where=None,
    min_count: int = 10,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Reliability diagram with gaps, per-bin counts and a confidence histogram.

    Top panel: accuracy per bin (bars), the gap to the bin's mean confidence
    (hatched bars from accuracy to confidence) and the diagonal of perfect
    calibration; each non-empty bin's sample count is printed above its bar.
    Bins with fewer than ``min_count`` samples, whose accuracy is mostly
    noise, are drawn in light grey (accuracy and gap alike) and named in the
    legend. Bottom panel: number of samples per bin, the same bins greyed.
    The title shows the ECE computed with the same bins
    (:func:`calib_jax.metrics.ece`).

    Args:
      probs: float ``[N, K]`` probabilities.
      labels: int ``[N]`` class ids.
      num_bins, binning, convention, where: as :func:`calib_jax.metrics.ece`.
      min_count: bins with fewer samples are greyed out (0: none).
      title: title prefix (default ``"Reliability"``).
      path: where to write a PNG (None: do not save).

    Returns:
      The ``matplotlib.figure.Figure``. The greyed bars of the top panel are
      the containers labelled ``LOW_COUNT_LABEL`` (``fig.axes[0].containers``).

    Raises:
      ValueError: negative ``min_count``.
    """
    _check_min_count(min_count)
    bins = metrics.reliability_bins(
        probs,
        labels,
        num_bins=num_bins,
        binning=binning,
        convention=convention,
        where=where,
    )
    value = float(
        metrics.ece(
            probs,
            labels,
            num_bins=num_bins,
            binning=binning,
            convention=convention,
            where=where,
        )
    )
    return reliability_diagram_of_bins(
        bins, ece=value, min_count=min_count, title=title, path=path
    )


def _check_min_count(min_count) -> None:
    if not isinstance(min_count, (int, np.integer)) or min_count < 0:
        raise ValueError(f"min_count must be an int >= 0, got {min_count!r}.")


def reliability_diagram_of_bins(
    bins,
    *,
    ece: float,
    min_count: int = 10,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """The figure of :func:`reliability_diagram` from per-bin data already computed.

    Args:
      bins: a mapping with ``count``, ``confidence``, ``accuracy``, ``lower``
        and ``upper`` arrays (or lists) of one length, as
        :func:`calib_jax.metrics.reliability_bins` returns.
      ece: the ECE of the same bins, shown in the title.
      min_count, title, path: as :func:`reliability_diagram`.

    Returns:
      The ``matplotlib.figure.Figure``.

    Raises:
      ValueError: negative ``min_count``.
    """
    _check_min_count(min_count)
    value = float(ece)
    count = np.asarray(bins["count"])
    conf = np.asarray(bins["confidence"])
    acc = np.asarray(bins["accuracy"])
    lower, upper = np.asarray(bins["lower"]), np.asarray(bins["upper"])
    width = np.maximum(upper - lower, 0.01)
    full = count >= max(min_count, 1)
    low = (count > 0) & ~full

    fig = _figure(5.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(
        lower[full],
        acc[full],
        width=width[full],
        align="edge",
        color="#3b75af",
        edgecolor="black",
        label="accuracy",
    )
    top.bar(
        lower[full],
        conf[full] - acc[full],
        bottom=acc[full],
        width=width[full],
        align="edge",
        color="#d62728",
        alpha=0.3,
        hatch="//",
        edgecolor="#d62728",
        label="gap",
    )
    if low.any():
        top.bar(
            lower[low],
            np.maximum(acc[low], conf[low]),
            width=width[low],
            align="edge",
            color=LOW_COUNT_COLOR,
            edgecolor="#999999",
            label=LOW_COUNT_LABEL.format(min_count=min_count),
        )
    for x, w, n, a, c in zip(lower, width, count, acc, conf):
        if n > 0:
            top.text(
                x + w / 2,
                min(max(a, c), 1.0) + 0.01,
                f"{int(n)}",
                ha="center",
                va="bottom",
                fontsize=6,
                color="#666666" if n < min_count else "black",
            )
    top.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1.08)
    top.set_ylabel("accuracy (samples per bin above)")
    top.legend(loc="upper left", fontsize="small")
    top.set_title(f"{title or 'Reliability'} (ECE = {100 * value:.2f}%)")
    colors = np.where(count >= min_count, "gray", LOW_COUNT_COLOR)
    bottom.bar(lower, count, width=width, align="edge", color=colors, edgecolor="black")
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("count")
    _save(fig, path)
    return fig


def smooth_reliability_diagram(
    probs,
    labels,
    *,
    bandwidth=None,
    target: str = "top_label",
    where=None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Smoothed reliability diagram of the smooth ECE (Błasiok and Nakkiran).

    Top panel: the smoothed curve of :func:`calib_jax.metrics.smooth_reliability`
    (the prediction plus its kernel-smoothed residual) drawn as a line, with a
    band around it whose half-width is proportional to the smoothed density
    of the predictions (the thick-where-dense line of the paper's figures),
    and the diagonal; the legend gives the smooth ECE and the bandwidth
    sigma. Bottom panel: the smoothed density itself. The gap between curve
    and diagonal, weighted by the density, integrates to the smooth ECE.

    Args:
      probs: float ``[N, K]`` probabilities.
      labels: int ``[N]`` class ids.
      bandwidth, target, where: as :func:`calib_jax.metrics.smooth_ece`.
      title: title (default ``"Smoothed reliability"``).
      path: where to write a PNG (None: do not save).

    Returns:
      The ``matplotlib.figure.Figure``; the curve is ``fig.axes[0].lines[0]``.
    """
    curve = metrics.smooth_reliability(
        probs, labels, bandwidth=bandwidth, target=target, where=where
    )
    grid = np.asarray(curve["grid"])
    acc = np.asarray(curve["accuracy"])
    density = np.asarray(curve["density"])
    value, sigma = float(curve["smece"]), float(curve["bandwidth"])
    half = 0.03 * density / max(float(np.max(density)), 1e-30)

    fig = _figure(5.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot(
        grid,
        acc,
        color="#d62728",
        linewidth=1.5,
        label=f"smoothed accuracy (smECE = {100 * value:.2f}%, σ = {sigma:.3g})",
    )
    top.fill_between(
        grid, acc - half, acc + half, color="#d62728", alpha=0.3, linewidth=0
    )
    top.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy" if target == "top_label" else "frequency of class 1")
    top.legend(loc="upper left", fontsize="small")
    top.set_title(f"{title or 'Smoothed reliability'} (smECE = {100 * value:.2f}%)")
    bottom.fill_between(grid, 0.0, density, color="gray")
    bottom.set_xlabel("confidence" if target == "top_label" else "p(class 1)")
    bottom.set_ylabel("density")
    _save(fig, path)
    return fig


def ece_vs_severity(
    results: Mapping[str, Mapping[int, Sequence[float]]],
    *,
    metric_name: str = "ECE",
    error: str | None = "std",
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Lines of a metric against shift severity, mean with error bars.

    The legend sits outside the axes, to their right, so it never hides a
    line. Give it a handful of methods (the benchmark report draws the
    baseline, the best and named methods here and every method in
    :func:`ece_vs_severity_grid`).

    Args:
      results: ``{method: {severity: [value per seed, ...]}}``; severity 0 is
        the clean test set.
      metric_name: y-axis label.
      error: ``'std'`` (sample standard deviation over seeds), ``'sem'``
        (standard error of the mean, std / sqrt(n)) or None (one value per
        severity, no error bars).
      title: optional title.
      path: where to write a PNG (None: do not save).

    Returns:
      The ``matplotlib.figure.Figure``.

    Raises:
      ValueError: empty ``results`` or a severity without values.
    """
    _check_curves(results, error)
    fig = _figure(7.0 + 1.5 * (1 + len(results) // 12), 4.5)
    ax = fig.subplots()
    _distinct_colors(ax, len(results))
    for method, by_severity in results.items():
        severities, mean, spread = _curve(method, by_severity, error)
        ax.errorbar(severities, mean, yerr=spread, marker="o", capsize=3, label=method)
    ax.set_xticks(sorted({s for curve in results.values() for s in curve}))
    ax.set_xlabel("shift severity (0 = clean)")
    spread = f" (mean ± {error} over seeds)" if error is not None else ""
    ax.set_ylabel(f"{metric_name}{spread}")
    ax.legend(
        fontsize="small",
        ncol=1 + len(results) // 12,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
    )
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    _save(fig, path)
    return fig


def _check_curves(results, error) -> None:
    if not results:
        raise ValueError("results is empty: nothing to plot.")
    if error not in ("std", "sem", None):
        raise ValueError(f"error must be 'std' or 'sem' (or None), got {error!r}.")


def _curve(method, by_severity, error):
    """``(severities, mean, error bars or None)`` of one method's values."""
    severities = sorted(by_severity)
    values = [np.asarray(by_severity[s], np.float64) for s in severities]
    if any(v.size == 0 for v in values):
        raise ValueError(f"method {method!r} has a severity without values.")
    mean = [v.mean() for v in values]
    std = [v.std(ddof=1) if v.size > 1 else 0.0 for v in values]
    if error == "sem":
        std = [sd / np.sqrt(v.size) for sd, v in zip(std, values)]
    return severities, mean, (std if error is not None else None)


def ece_vs_severity_grid(
    results: Mapping[str, Mapping[int, Sequence[float]]],
    *,
    reference: str | None = None,
    metric_name: str = "ECE",
    error: str | None = "std",
    ncols: int = 5,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Every method's curve of :func:`ece_vs_severity` in a panel of its own.

    Small multiples on one shared y axis, in the order of ``results``; the
    ``reference`` method (e.g. the cross-entropy baseline) is repeated as a
    thin grey line in every other panel, so each method reads against it.

    Args:
      results: as :func:`ece_vs_severity`.
      reference: a key of ``results`` drawn in every panel (None: none).
      metric_name: the y-axis label (of the first column).
      error: as :func:`ece_vs_severity`.
      ncols: panels per row.
      title: optional figure title.
      path: where to write a PNG (None: do not save).

    Returns:
      The ``matplotlib.figure.Figure``; ``fig.axes[i]`` is the panel of the
      i-th method.

    Raises:
      ValueError: empty ``results``, a severity without values, a
        ``reference`` not in ``results`` or ``ncols < 1``.
    """
    _check_curves(results, error)
    if reference is not None and reference not in results:
        raise ValueError(
            f"reference {reference!r} is not a method of results: {', '.join(results)}."
        )
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}.")
    n = len(results)
    cols = min(ncols, n)
    rows = -(-n // cols)
    fig = _figure(2.4 * cols + 0.6, 2.0 * rows + 0.8)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True)).ravel()
    ref = _curve(reference, results[reference], error) if reference else None
    for ax, (method, by_severity) in zip(axes, results.items()):
        if ref is not None and method != reference:
            ax.plot(ref[0], ref[1], color="#9e9e9e", linewidth=1.0)
        severities, mean, spread = _curve(method, by_severity, error)
        ax.errorbar(severities, mean, yerr=spread, marker="o", markersize=3, capsize=2)
        ax.set_title(method, fontsize="small")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize="x-small")
    for ax in axes[n:]:
        ax.set_visible(False)
    axes[0].set_xticks(sorted({s for curve in results.values() for s in curve}))
    for ax in axes[::cols]:
        ax.set_ylabel(metric_name, fontsize="x-small")
    for ax in axes[(rows - 1) * cols : n]:
        ax.set_xlabel("severity", fontsize="x-small")
    text = title or ""
    if reference:
        text += f" (grey: {reference})"
    if text:
        fig.suptitle(text.strip(), fontsize="medium")
    fig.tight_layout()
    _save(fig, path)
    return fig


def accuracy_vs_ece(
    points: Mapping[str, tuple[float, float, float, float]],
    *,
    ece_name: str = "ECE",
    title: str | None = None,
    outlier_gap: float = 0.1,
    path: str | os.PathLike | None = None,
):
    """Scatter of accuracy against a calibration error, one point a method.

    Methods are told apart by colour and marker in a legend beside the axes.
    A method whose accuracy is more than ``outlier_gap`` below the median
    accuracy is left out of the axes (which would otherwise be stretched
    until the rest overlap) and named, with its values, under the plot.

    Args:
      points: ``{method: (accuracy, accuracy_err, ece, ece_err)}`` (fractions;
        the errors are drawn as bars, e.g. SEM over seeds).
      ece_name: x-axis label.
      title: optional title.
      outlier_gap: accuracy gap below the median that marks an outlier.
      path: where to write a PNG (None: do not save).

    Returns:
      The ``matplotlib.figure.Figure``.

    Raises:
      ValueError: empty ``points``.
    """
    if not points:
        raise ValueError("points is empty: nothing to plot.")
    median = float(np.median([v[0] for v in points.values()]))
    shown = {m: v for m, v in points.items() if v[0] >= median - outlier_gap}
    left_out = [m for m in points if m not in shown]
    fig = _figure(8.0, 4.8)
    ax = fig.subplots()
    _distinct_colors(ax, len(shown))
    markers = "osD^v<>pPX*h"
    for i, (method, (acc, acc_err, err, err_err)) in enumerate(shown.items()):
        ax.errorbar(
            100 * err,
            100 * acc,
            xerr=100 * err_err,
            yerr=100 * acc_err,
            marker=markers[i % len(markers)],
            capsize=2,
            linestyle="none",
            label=method,
        )
    ax.set_xlabel(f"{ece_name} (%)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if left_out:
        text = "; ".join(
            f"{m}: accuracy {100 * points[m][0]:.1f}%, {ece_name} "
            f"{100 * points[m][2]:.1f}%"
            for m in left_out
        )
        fig.text(
            0.01,
            0.0,
            f"not shown (accuracy far below the rest): {text}",
            fontsize="x-small",
            va="bottom",
        )
    if title:
        ax.set_title(title)
    _save(fig, path)
    return fig
