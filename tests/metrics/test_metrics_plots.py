"""The plot functions write non-empty PNG files."""

from __future__ import annotations

import pytest
from metrics._cases import softmax_case

from calib_jax import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_reliability_diagram_png(tmp_path):
    probs, labels = softmax_case(n=200, k=10, seed=31)
    path = tmp_path / "reliability.png"
    fig = plots.reliability_diagram(probs, labels, num_bins=10, path=path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "ECE" in fig.axes[0].get_title()


def test_ece_vs_severity_png(tmp_path):
    results = {
        "ce": {0: [0.02, 0.03], 1: [0.05, 0.06], 3: [0.12, 0.10], 5: [0.2, 0.25]},
        "focal": {0: [0.01, 0.02], 1: [0.03, 0.04], 3: [0.08, 0.07], 5: [0.15, 0.1]},
    }
    path = tmp_path / "severity.png"
    plots.ece_vs_severity(results, path=path, title="digits-C")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    with pytest.raises(ValueError, match="empty"):
        plots.ece_vs_severity({})


def test_ece_vs_severity_error_bars_are_std_or_sem():
    import numpy as np

    values = [0.1, 0.2, 0.6]
    for error, expected in (
        ("std", np.std(values, ddof=1)),
        ("sem", np.std(values, ddof=1) / np.sqrt(3)),
    ):
        fig = plots.ece_vs_severity({"ce": {0: values}}, error=error)
        # errorbar's vertical bar spans mean - err .. mean + err
        segments = fig.axes[0].containers[0].lines[2][0].get_segments()
        (_, lo), (_, hi) = segments[0]
        assert (hi - lo) / 2 == pytest.approx(expected)
    with pytest.raises(ValueError, match="'std' or 'sem'"):
        plots.ece_vs_severity({"ce": {0: values}}, error="var")
    # None: one value per severity, no error bars, no "over seeds" in the label.
    fig = plots.ece_vs_severity({"ce": {0: [0.1], 3: [0.4]}}, error=None)
    bars = fig.axes[0].containers[0].lines[2]
    assert len(bars) == 0
    assert "seeds" not in fig.axes[0].get_ylabel()


def test_accuracy_vs_ece_png(tmp_path):
    points = {f"m{i}": (0.9 + i / 100, 0.01, 0.05 - i / 500, 0.002) for i in range(12)}
    path = tmp_path / "scatter.png"
    fig = plots.accuracy_vs_ece(points, path=path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    offsets = [c.lines[0].get_xydata()[0] for c in fig.axes[0].containers]
    assert offsets[3][0] == pytest.approx(100 * (0.05 - 3 / 500))  # x = ECE in %
    assert offsets[3][1] == pytest.approx(100 * 0.93)  # y = accuracy in %
    # A method far below the median accuracy is named under the plot instead.
    fig = plots.accuracy_vs_ece(dict(points, bad=(0.3, 0.05, 0.4, 0.1)))
    assert len(fig.axes[0].containers) == 12
    assert "bad: accuracy 30.0%" in fig.texts[0].get_text()
    with pytest.raises(ValueError, match="empty"):
        plots.accuracy_vs_ece({})


def test_smooth_reliability_diagram_shows_the_metric_curve(tmp_path):
    import numpy as np

    from calib_jax import metrics

    probs, labels = softmax_case(n=300, k=10, seed=32)
    path = tmp_path / "smooth.png"
    fig = plots.smooth_reliability_diagram(probs, labels, path=path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    curve = metrics.smooth_reliability(probs, labels)
    x, y = fig.axes[0].lines[0].get_data()
    np.testing.assert_array_equal(x, np.asarray(curve["grid"]))
    np.testing.assert_array_equal(y, np.asarray(curve["accuracy"]))
    label = fig.axes[0].get_legend().get_texts()[0].get_text()
    assert f"smECE = {100 * float(curve['smece']):.2f}%" in label
    assert f"σ = {float(curve['bandwidth']):.3g}" in label
    assert "smECE" in fig.axes[0].get_title()
