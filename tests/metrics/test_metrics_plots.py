"""The plot functions write non-empty PNG files."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgb
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


def _bbox(artist, fig):
    return artist.get_window_extent(fig.canvas.get_renderer())


def _curves(n_methods, seeds=3):
    rng = np.random.default_rng(0)
    return {
        f"method_{i}": {
            s: list(0.02 * s + rng.uniform(0, 0.01, seeds)) for s in range(6)
        }
        for i in range(n_methods)
    }


@pytest.mark.parametrize("n_methods", [1, 4, 20])
def test_ece_vs_severity_legend_lies_outside_the_axes(n_methods):
    fig = plots.ece_vs_severity(_curves(n_methods), error="sem")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend, axes_box = _bbox(ax.get_legend(), fig), _bbox(ax, fig)
    assert legend.x0 >= axes_box.x1  # wholly to the right: no line hidden
    assert not legend.overlaps(axes_box)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(
        _curves(n_methods)
    )


def test_ece_vs_severity_grid_has_a_panel_per_method_with_the_reference():
    curves = _curves(7)
    fig = plots.ece_vs_severity_grid(curves, reference="method_0", ncols=3, error=None)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == list(curves)
    assert len(fig.axes) == 9  # 3 x 3, the last two hidden
    ys = [ax.get_ylim() for ax in shown]
    assert all(y == ys[0] for y in ys)  # one shared y axis
    mean0 = [np.mean(curves["method_0"][s]) for s in range(6)]
    for ax in shown[1:]:  # the grey reference line, then the method
        np.testing.assert_allclose(ax.lines[0].get_ydata(), mean0, rtol=1e-12)
    assert len(shown[0].lines) == 1  # the reference's own panel: no repeat
    with pytest.raises(ValueError, match="reference 'nope' is not a method"):
        plots.ece_vs_severity_grid(curves, reference="nope")


GREY = to_rgb(plots.LOW_COUNT_COLOR)


def test_reliability_diagram_counts_and_greys_out_low_count_bins():
    rng = np.random.default_rng(0)
    # 200 confident samples (bin 14), 3 near 0.5 (bin 7), 12 near 0.7 (bin 10).
    conf = np.concatenate([np.full(200, 0.97), np.full(3, 0.5), np.full(12, 0.7)])
    probs = np.stack([conf, 1 - conf], axis=1)
    labels = (rng.uniform(size=conf.size) > conf).astype(int)
    fig = plots.reliability_diagram(probs, labels, num_bins=15, min_count=10)
    top, bottom = fig.axes
    low = [c for c in top.containers if c.get_label().startswith("< 10 samples")]
    assert len(low) == 1 and len(low[0].patches) == 1  # only the 3-sample bin
    (bar,) = low[0].patches
    assert bar.get_x() == pytest.approx(7 / 15)
    assert bar.get_facecolor()[:3] == pytest.approx(GREY)
    texts = {t.get_text(): t.get_position()[0] for t in top.texts}
    assert set(texts) == {"200", "3", "12"}
    assert texts["3"] == pytest.approx(7.5 / 15)
    # The count panel greys the same bin; the legend names the greyed bins.
    grey = [
        p.get_x()
        for p in bottom.patches
        if p.get_height() > 0 and p.get_facecolor()[:3] == pytest.approx(GREY)
    ]
    assert grey == [pytest.approx(7 / 15)]
    labels_shown = [t.get_text() for t in top.get_legend().get_texts()]
    assert "< 10 samples (noisy)" in labels_shown
    # min_count=0 greys nothing.
    fig = plots.reliability_diagram(probs, labels, num_bins=15, min_count=0)
    assert not any(c.get_label().startswith("<") for c in fig.axes[0].containers)
