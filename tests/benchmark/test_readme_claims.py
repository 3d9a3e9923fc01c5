"""The README's claims summary is the one the kept demo run gives.

``tests/benchmark/expected/demo`` keeps, from the ``make demo`` run the README
quotes, the per-seed values its claims read (``claim_rows.jsonl``, from
:func:`calib_jax.benchmark.report.claim_rows`) and the run's grid, timing and
``results.jsonl`` sha256 (``run.json``). The README's block between its claims
markers must be :func:`calib_jax.benchmark.report.claims_summary` of the claims
of those rows: the table the report prints, from today's code.
``make update-expected`` rewrites all three.
"""

from __future__ import annotations

import json
import re

import pytest
from etils import epath

from calib_jax import storage
from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import paper_claims, report, reproducibility, runner, tables

ROOT = epath.Path(__file__).resolve().parent.parent.parent
EXPECTED = epath.Path(__file__).resolve().parent / "expected"
BEGIN = "<!-- claims:begin: written by `make update-expected`, do not edit -->"
END = "<!-- claims:end -->"


def _readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    inside = text.split(BEGIN)[1].split(END)[0]
    return inside.strip("\n").split("\n")


def _demo():
    rows = storage.read_jsonl(EXPECTED / "demo" / "claim_rows.jsonl")
    run = json.loads((EXPECTED / "demo" / "run.json").read_text())
    return rows, run


def test_readme_claims_table_is_rendered_from_the_kept_demo_run():
    rows, run = _demo()
    want = report.claims_summary(paper_claims.claims(rows), run)
    assert _readme_block() == want


def test_readme_states_the_kept_results_sha256():
    _, run = _demo()
    assert re.fullmatch(r"[0-9a-f]{64}", run["results_sha256"])
    (line,) = [ln for ln in _readme_block() if "sha256" in ln]
    assert re.findall(r"sha256 `([0-9a-f]+)`", line) == [run["results_sha256"]]


def test_kept_demo_rows_are_the_whole_grid():
    rows, run = _demo()
    # One clean and one mean-over-shifted row per method, calibrator and seed.
    n = run["methods"] * run["calibrators"] * len(run["seeds"]) * 2
    assert len(rows) == n
    assert len(agg.methods(rows)) == run["methods"]
    assert len(agg.calibrators(rows)) == run["calibrators"]
    assert sorted({r["seed"] for r in rows}) == run["seeds"]


def test_claim_rows_give_the_claims_of_every_row():
    # Any machine's recording of the quick run (they share the grid).
    (recording, *_) = reproducibility.recordings(EXPECTED / "quick")
    rows = storage.read_jsonl(EXPECTED / "quick" / recording / runner.RESULTS_FILE)
    kept = report.claim_rows(rows)
    assert paper_claims.claims(kept) == paper_claims.claims(rows)
    # Per seed: the clean value, and the mean over the shifted sets.
    row = next(
        r
        for r in kept
        if (r["method"], r["calibrator"], r["seed"]) == ("ce", "none", 0)
    )
    assert row["shift"] == "clean"
    clean = [
        r["ece"]
        for r in rows
        if (r["method"], r["calibrator"], r["seed"], r["shift"])
        == ("ce", "none", 0, "clean")
    ]
    assert row["ece"] == clean[0]
    shifted = [
        r["ece"]
        for r in rows
        if (r["method"], r["calibrator"], r["seed"]) == ("ce", "none", 0)
        and r["shift"] != "clean"
    ]
    (mean,) = [
        r["ece"]
        for r in kept
        if (r["method"], r["calibrator"], r["seed"], r["shift"])
        == ("ce", "none", 0, "all")
    ]
    assert len(shifted) == 10
    assert mean == pytest.approx(sum(shifted) / len(shifted), rel=1e-12)


def test_claims_summary_line_with_and_without_timing():
    rows, run = _demo()
    entries = paper_claims.claims(rows)
    run = dict(run, seeds=[0, 1, 2], methods=22, calibrators=14)
    run |= {"dataset": "digits", "model": "mlp", "num_epochs": 30.0}
    run |= {"results_sha256": "ab" * 32, "wall_seconds": 271.4}
    run |= {"cpus": 2, "load_average": 0.91}
    lines = report.claims_summary(entries, run)
    assert lines[0] == (
        "From one `make demo` run (`configs/benchmark_digits.py`: 22 methods x 14 "
        "calibrators x seeds 0, 1, 2, `mlp` on `digits`, 30 epochs; 4 min 31 s on "
        "2 CPU cores, load average 0.91 at the start; `results.jsonl` sha256 "
        f"`{'ab' * 32}`), the report's *Claims* table:"
    )
    assert lines[2:] == tables.claims_table(entries)
    assert len(lines) == 2 + 2 + len(entries)
    untimed = report.claims_summary(entries, dict(run, wall_seconds=None))
    assert "30 epochs; `results.jsonl` sha256" in untimed[0]
