"""The benchmark end to end on a tiny digits grid: report, resume, determinism, errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calib_jax.benchmark import report, runner
from configs import benchmark_digits

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("ce", "two_stage", "sb_ece")
CALIBRATORS = ("none", "ts:nll", "ts:sb_ece")


def tiny_config():
    c = benchmark_digits.get_config()
    c.methods = METHODS
    c.calibrators = CALIBRATORS
    c.seeds = (0, 1)
    c.train.num_steps = 24
    c.train.shifts.corruptions = "gaussian_noise"
    c.train.shifts.severities = (1, 3)
    c.two_stage.num_steps = 12
    c.log.tensorboard = True
    c.report.methods = ("sb_ece",)
    return c


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bench")
    runner.run(tiny_config(), workdir)
    return workdir


def _table(text: str, heading: str) -> dict[str, dict[str, str]]:
    """``{first cell: {column: cell}}`` of the markdown table under ``heading``."""
    block = text.split(heading, 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0]] = dict(zip(header, cells))
    return out


def _mean_sem(values) -> str:
    v = np.asarray(values, np.float64)
    sem = v.std(ddof=1) / np.sqrt(v.size)
    return f"{100 * v.mean():.2f} ± {100 * sem:.2f}"


@pytest.mark.long
def test_outputs_and_report_recomputable_from_results(finished):
    rows = [json.loads(ln) for ln in (finished / "results.jsonl").open()]
    # methods x calibrators x seeds x (clean + 2 shifted sets)
    assert len(rows) == 3 * 3 * 2 * 3
    assert {r["shift"] for r in rows} == {
        "clean",
        "gaussian_noise/1",
        "gaussian_noise/3",
    }
    # One reliability row per result row, in the same order (the report's
    # diagrams read these, never a cell's files).
    bins = [json.loads(ln) for ln in (finished / "reliability.jsonl").open()]
    keys = ("method", "calibrator", "seed", "shift", "corruption", "severity")
    assert [[b[k] for k in keys] for b in bins] == [[r[k] for k in keys] for r in rows]
    assert all(b["ece"] == r["ece"] for b, r in zip(bins, rows))
    assert all(sum(b["count"]) == sum(bins[0]["count"]) for b in bins)
    for name in ("ece_vs_severity.png", "accuracy_vs_ece.png", "reliability_best.png"):
        data = (finished / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = (finished / "report.md").read_text()

    # Independent recomputation (plain numpy over the JSONL rows).
    def seeds_of(method, cal, metric, shifted):
        out = {}
        for r in rows:
            if (r["method"], r["calibrator"]) == (method, cal) and (
                r["shift"] != "clean"
            ) == shifted:
                out.setdefault(r["seed"], []).append(r[metric])
        return [np.mean(v) for _, v in sorted(out.items())]

    for heading, metric in (
        ("ECE with 15 equal-mass bins, l2", "ece_l2_em"),
        ("ECE with 15 equal-width bins, l1 (focal", "ece"),
    ):
        table = _table(text, heading)
        assert set(table) == set(METHODS)
        for method in METHODS:
            got = table[method]
            assert got["Accuracy (clean)"] == _mean_sem(
                seeds_of(method, "none", "accuracy", False)
            )
            assert got["ECE (clean)"] == _mean_sem(
                seeds_of(method, "none", metric, False)
            )
            assert got["ECE+TS (shifted)"] == _mean_sem(
                seeds_of(method, "ts:nll", metric, True)
            )
            assert got["ECE+TS-SB-ECE (shifted)"] == _mean_sem(
                seeds_of(method, "ts:sb_ece", metric, True)
            )
    # TS preserves accuracy, the rows say so.
    for method in METHODS:
        assert seeds_of(method, "ts:nll", "accuracy", False) == seeds_of(
            method, "none", "accuracy", False
        )

    claims = _table(text, "## Claims")
    papers = " ".join(claims)
    for paper in ("Soft calibration", "ACLS", "Class-wise", "MaC-Cal", "AU_Pxτ"):
        assert paper in papers
    mac = next(v for k, v in claims.items() if k.startswith("MaC-Cal"))
    clean_diff = np.mean(seeds_of("two_stage", "none", "ece", False)) - np.mean(
        seeds_of("ce", "none", "ece", False)
    )
    assert (
        f"two_stage - ce {100 * clean_diff:+.2f}"
        in mac["measured (paired difference, pp)"]
    )


@pytest.mark.long
def test_report_embeds_every_figure_and_tensorboard_holds_cells_and_figures(
    finished,
):
    from _events import read_events

    from calib_jax.tensorboard import tag

    text = (finished / "report.md").read_text()
    embedded = report.figures(text)
    assert sorted(embedded) == sorted(p.name for p in finished.glob("*.png"))
    assert {"ece_vs_severity.png", "ece_vs_severity_all.png"} <= set(embedded)
    rows = [json.loads(ln) for ln in (finished / "results.jsonl").open()]
    cell = [r for r in rows if (r["method"], r["seed"]) == ("sb_ece", 1)]
    scalars, _ = read_events(str(finished / "tensorboard" / "sb_ece" / "seed1"))
    for r in cell:
        shift = "test" if r["shift"] == "clean" else r["shift"]
        for m in ("ece", "accuracy", "nll"):
            key = tag(f"{r['calibrator']}/{shift}/{m}")
            assert scalars[(key, 0)] == np.float32(r[m])
        curve = scalars[(tag(f"{r['calibrator']}/ece_vs_severity"), r["severity"])]
        assert curve == np.float32(r["ece"])  # one corruption: the mean is it
    _, images = read_events(str(finished / "tensorboard" / "report"))
    assert sorted(images) == sorted((n.removesuffix(".png"), 0) for n in embedded)
    # Each cell's training run wrote its own events (losses per logged step).
    train_events, _ = read_events(
        str(finished / "cells" / "ce" / "seed0" / "train" / "tensorboard")
    )
    assert ("loss/total", 24) in train_events and ("test/ece", 24) in train_events


@pytest.mark.long
def test_killed_benchmark_resumes_without_recomputing_and_is_deterministic(finished):
    cells = sorted(finished.glob("cells/*/seed*/rows.jsonl"))
    assert len(cells) == 6
    cells += sorted(finished.glob("cells/*/seed*/reliability.jsonl"))
    assert len(cells) == 12
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in cells}
    results = (finished / "results.jsonl").read_bytes()
    reliability = (finished / "reliability.jsonl").read_bytes()
    # A cell killed before it finished: no rows, no finished training run.
    lost = finished / "cells" / "sb_ece" / "seed1"
    (lost / "rows.jsonl").unlink()
    for p in sorted((lost / "train").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    # A cell of a workdir written before reliability rows existed: its
    # post-hoc evaluation reruns (the training is done), giving the same rows.
    stale = finished / "cells" / "ce" / "seed0"
    (stale / "reliability.jsonl").unlink()
    runner.run(tiny_config(), finished)
    for p, (mtime, data) in before.items():
        if p.parent in (lost, stale):
            # Retrained from scratch: the same rows, bit for bit.
            assert p.read_bytes() == data
        else:
            assert p.stat().st_mtime_ns == mtime  # not recomputed
    assert (finished / "results.jsonl").read_bytes() == results
    assert (finished / "reliability.jsonl").read_bytes() == reliability


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(methods=("ce", "nope")), "Unknown method(s) 'nope'"),
        (dict(calibrators=("none", "ts:bogus")), "Unknown calibrator(s) 'ts:bogus'"),
        (dict(seeds=()), "grid is empty: config.seeds"),
        (dict(methods=()), "grid is empty: config.methods"),
    ],
)
def test_bad_grid_is_one_line_before_compute(tmp_path, change, message):
    c = tiny_config()
    for k, v in change.items():
        setattr(c, k, v)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        runner.run(c, tmp_path / "w")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "w").exists()


@pytest.mark.long
def test_a_diverging_cell_stops_the_benchmark_naming_the_cell(tmp_path):
    c = tiny_config()
    c.methods, c.seeds = ("ce",), (0,)
    c.train.optimizer.name = "sgd"
    c.train.optimizer.learning_rate = 1e6
    c.train.checkpoint_every = 8
    with pytest.raises(
        FloatingPointError, match=r"^ce seed 0 \(.*\): training diverged"
    ):
        runner.run(c, tmp_path / "w")
    assert not (tmp_path / "w" / "results.jsonl").exists()


def test_workdir_of_another_benchmark_is_refused_and_kept(tmp_path):
    workdir = tmp_path / "w"
    runner.check_workdir(tiny_config(), workdir)
    saved = (workdir / runner.CONFIG_FILE).read_text()
    other = tiny_config()
    other.seeds = (0, 1, 2)
    with pytest.raises(ValueError, match="different benchmark config.*seeds"):
        runner.run(other, workdir)
    assert (workdir / runner.CONFIG_FILE).read_text() == saved


@pytest.mark.long
def test_cli_unknown_method_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "calib_jax.benchmark",
            "--config",
            str(ROOT / "configs" / "benchmark_digits.py:quick"),
            "--workdir",
            str(tmp_path / "w"),
            "--config.methods=('ce','softmax_party')",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=900,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "softmax_party" in lines[0], proc.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.long
def test_report_has_the_conformal_table(finished):
    text = (finished / "report.md").read_text()
    block = text.split("## Conformal prediction sets (alpha = 0.1)", 1)[1]
    block = block.split("\n## ", 1)[0]
    body = [ln for ln in block.splitlines() if ln.startswith("| ")][1:]
    assert len(body) == len(METHODS) * len(CALIBRATORS)
    rows = [json.loads(ln) for ln in (finished / "results.jsonl").open()]
    assert all(0.0 <= r["conformal_aps_coverage"] <= 1.0 for r in rows)


@pytest.mark.long
def test_report_has_ood_and_bootstrap_tables(finished):
    text = (finished / "report.md").read_text()
    for heading in (
        "## OOD detection against `digits_patches`",
        "## Bootstrap 95% intervals (clean test, seed 0)",
    ):
        block = text.split(heading, 1)[1].split("\n## ", 1)[0]
        body = [ln for ln in block.splitlines() if ln.startswith("| ")][1:]
        assert len(body) == len(METHODS) * len(CALIBRATORS), heading
    rows = [json.loads(ln) for ln in (finished / "results.jsonl").open()]
    clean = [r for r in rows if r["shift"] == "clean"]
    # A far-OOD set: tiles of photographs are easy to tell from digits.
    assert all(0.5 < r["ood_auroc"] <= 1.0 for r in clean)
    assert all(r["accuracy_lo"] <= r["accuracy"] <= r["accuracy_hi"] for r in clean)


def test_unwritable_tensorboard_dir_is_one_line_before_anything_is_written(tmp_path):
    config = tiny_config()  # log.tensorboard on
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "tensorboard").write_text("")  # a file where the directory goes
    with pytest.raises(ValueError) as err:
        runner.validate(config, workdir)
    message = str(err.value)
    assert "\n" not in message
    assert (
        f"TensorBoard log directory {workdir / 'tensorboard'} is not writable"
        in message
    )
    assert [p.name for p in workdir.iterdir()] == ["tensorboard"]  # no config.json
