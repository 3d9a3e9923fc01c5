"""metrics.jsonl: the resume truncation and the deduplicating reader."""

from __future__ import annotations

import json

from calib_jax.train import metrics_log


def _line(step, **values):
    return json.dumps({"step": step, "time": 1.0, **values}) + "\n"


def test_truncate_after_drops_later_steps_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    kept = _line(5, loss=1.0) + _line(10, loss=0.5) + _line(10, ece=0.1)
    path.write_text(kept + _line(15, loss=0.4) + '{"step": 20, "lo')
    metrics_log.JsonlWriter(path).truncate_after(10)
    assert path.read_text() == kept
    metrics_log.JsonlWriter(path).truncate_after(10)  # nothing to drop: unchanged
    assert path.read_text() == kept
    metrics_log.JsonlWriter(path).truncate_after(0)
    assert path.read_text() == ""
    metrics_log.JsonlWriter(tmp_path / "missing.jsonl").truncate_after(3)
    assert not (tmp_path / "missing.jsonl").exists()


def test_load_jsonl_keeps_the_last_record_of_each_step_and_kind(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # An old log: steps 15 and 20 were logged, the run resumed from step 10.
    path.write_text(
        _line(10, loss=0.5)
        + _line(15, loss=0.4)
        + _line(20, loss=0.3)
        + _line(15, loss=0.41)
        + _line(20, loss=0.31)
        + _line(20, ece=0.2)
        + _line(20, ece=0.21)
    )
    rows = metrics_log.load_jsonl(path)
    assert [(r["step"], r.get("loss", r.get("ece"))) for r in rows] == [
        (10, 0.5),
        (15, 0.41),
        (20, 0.31),
        (20, 0.21),
    ]


def test_write_replace_drops_the_older_record_of_its_step_and_keys(tmp_path):
    """A finished run run again evaluates its last step again: once in the log."""
    path = tmp_path / "metrics.jsonl"
    writer = metrics_log.JsonlWriter(path)
    writer.write(10, {"loss": 0.5})
    writer.write(10, {"ece": 0.2}, replace=True)  # nothing to replace: appended
    writer.write(10, {"ece": 0.3}, replace=True)
    writer.write(10, {"loss": 0.4})  # no replace: appended
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r.get("loss", r.get("ece"))) for r in rows] == [
        (10, 0.5),
        (10, 0.3),
        (10, 0.4),
    ]
