"""Progress bars: rate and ETA; outside a terminal one line per interval, no CR."""

from __future__ import annotations

import io
import os
import re

import pytest

from calib_jax import progress

LINE = re.compile(
    r"^train: +(\d+)%\|[# 0-9]*\| +(\d+)/40 \[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?"
    r"(step/s|s/step)\]$"
)


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _shown(progress_shown):
    """The bars under test are on (the session turns them off, see conftest)."""


def _bar_and_progress_lines(stream):
    with progress.bar(4, desc="train", unit="step", stream=stream, interval=0.0) as b:
        b.update(4)
    with progress.Progress(10, stream=stream, interval=0.0) as p:
        p("test", 10)
    return stream.getvalue().splitlines()


def test_the_test_session_turns_the_bars_off(monkeypatch):
    # conftest sets it for the session and for the command lines it starts.
    monkeypatch.undo()
    assert os.environ["CALIB_JAX_PROGRESS"] == "0"
    assert _bar_and_progress_lines(io.StringIO()) == []
    assert _bar_and_progress_lines(_Tty()) == []


@pytest.mark.parametrize("value", ["1", "auto", "AUTO", None])
def test_calib_jax_progress_on_or_unset_shows_every_bar(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CALIB_JAX_PROGRESS")
    else:
        monkeypatch.setenv("CALIB_JAX_PROGRESS", value)
    assert progress.shown()
    lines = _bar_and_progress_lines(io.StringIO())
    train = [ln.split("|")[0] for ln in lines if ln.startswith("train:")]
    assert train[0] == "train:   0%" and train[-1] == "train: 100%"
    evaluate = [ln for ln in lines if ln.startswith("evaluate:")]
    assert len(evaluate) == 2  # the update and the final line
    for line in evaluate:
        assert line.startswith("evaluate: 10/10 images (100%), test, ")
    assert len(train) + len(evaluate) == len(lines)
    tty = _Tty()
    _bar_and_progress_lines(tty)
    assert "train: 100%" in tty.getvalue() and "\r" in tty.getvalue()


def test_calib_jax_progress_0_turns_every_bar_off(monkeypatch):
    monkeypatch.setenv("CALIB_JAX_PROGRESS", "0")
    assert not progress.shown()
    assert _bar_and_progress_lines(io.StringIO()) == []
    assert _bar_and_progress_lines(_Tty()) == []


def test_calib_jax_progress_of_another_value_is_one_line(monkeypatch):
    monkeypatch.setenv("CALIB_JAX_PROGRESS", "yes")
    with pytest.raises(ValueError) as info:
        progress.bar(5, desc="x", unit="it", stream=io.StringIO())
    assert str(info.value) == "CALIB_JAX_PROGRESS must be 0, 1 or auto, got 'yes'"


def test_off_a_terminal_every_update_past_the_interval_is_one_line():
    stream = io.StringIO()
    with progress.bar(40, desc="train", unit="step", stream=stream, interval=0.0) as b:
        for _ in range(4):
            b.update(10)
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert all(LINE.match(ln) for ln in lines), lines
    done = [int(LINE.match(ln).group(2)) for ln in lines]
    assert done[0] == 0 and done[-1] == 40 and done == sorted(done)
    assert {10, 20, 30, 40} <= set(done)


def test_off_a_terminal_a_long_interval_gives_only_the_first_and_last_lines():
    stream = io.StringIO()
    with progress.bar(40, desc="train", unit="step", stream=stream, interval=1e6) as b:
        for _ in range(40):
            b.update(1)
    done = [int(LINE.match(ln).group(2)) for ln in stream.getvalue().splitlines()]
    assert done == [0, 40]


def test_a_nested_bar_on_a_terminal_is_drawn_below_and_removed():
    stream = _Tty()
    outer = progress.bar(2, desc="benchmark", unit="cell", stream=stream)
    inner = progress.bar(40, desc="train", unit="step", stream=stream, level=1)
    assert (abs(outer.pos), abs(inner.pos)) == (0, 1)
    assert inner.leave is False and outer.leave is True
    inner.update(40)
    inner.close()
    outer.close()
    assert "\r" in stream.getvalue()  # redrawn in place


def test_disabled_bar_writes_nothing():
    stream = io.StringIO()
    with progress.bar(5, desc="x", unit="it", stream=stream, enabled=False) as b:
        b.update(5)
        b.set_postfix_str("y")
    assert stream.getvalue() == ""


@pytest.mark.long
def test_training_off_a_terminal_logs_step_and_evaluation_lines_and_no_events(
    tmp_path, monkeypatch
):
    from calib_jax.train.loop import train_and_evaluate
    from configs import digits_ce

    c = digits_ce.get_config()
    c.num_steps, c.log_every = 6, 3
    c.shifts.corruptions = "none"
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)
    train_and_evaluate(c, tmp_path / "run")
    text = stream.getvalue()
    assert "\r" not in text
    steps = [ln for ln in text.splitlines() if ln.startswith("train mlp/digits:")]
    assert steps and steps[-1].split("|")[2].strip().startswith("6/6")
    assert all("step/s" in ln or "s/step" in ln for ln in steps)
    evals = [ln for ln in text.splitlines() if ln.startswith("evaluate: ")]
    assert evals and re.match(r"evaluate: (\d+)/\1 images \(100%\)", evals[-1])
    assert "img/s, ETA" in evals[-1]
    # TensorBoard is off by default: no event directory.
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_nested_bars_off_a_terminal_write_plain_lines():
    stream = io.StringIO()
    outer = progress.bar(2, desc="benchmark", unit="cell", stream=stream, interval=0)
    inner = progress.bar(3, desc="fits", unit="fit", stream=stream, level=1)
    inner.update(3)
    inner.close()
    outer.update(1)
    outer.close()
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text
    lines = text.splitlines()
    # Each bar's closing line repeats its last count and is skipped.
    assert [ln.split("|")[0] for ln in lines] == [
        "benchmark:   0%",
        "fits:   0%",
        "fits: 100%",
        "benchmark:  50%",
    ]


def test_a_closing_line_with_another_bar_width_is_still_skipped():
    # tqdm sizes the drawn bar to fit the rate text, whose length follows the
    # timing ("12.3cell/s" or "1.23s/cell"): the closing line of a bar can
    # differ from its last update in the bar alone, and is still a repeat.
    stream = io.StringIO()
    lines = progress.LineStream(stream)
    lines.write("\rbenchmark:  50%|#####     | 1/2 [00:00<00:00, 9.1cell/s]")
    lines.write("\rbenchmark:  50%|####      | 1/2 [00:01<00:01, 1.23s/cell]")
    lines.write("\rbenchmark: 100%|##########| 2/2 [00:02<00:00, 1.00s/cell]")
    assert [ln.split(" [")[0] for ln in stream.getvalue().splitlines()] == [
        "benchmark:  50%|#####     | 1/2",
        "benchmark: 100%|##########| 2/2",
    ]
