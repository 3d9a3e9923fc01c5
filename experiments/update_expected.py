"""Regenerates the expected benchmark results and the README's claims summary.

Run: ``make update-expected`` (or ``.venv/bin/python experiments/update_expected.py``);
about 8 minutes on a quiet 2-core CPU. It runs, on the CPU, in fresh workdirs
under a temporary directory (printed, and kept):

- the quick benchmark (``configs/benchmark_digits.py:quick``, as
  ``tests/benchmark/test_results_drift.py`` runs it), and writes this
  machine's recording ``tests/benchmark/expected/quick/<machine>/``
  (``<machine>``: :func:`calib_jax.benchmark.reproducibility.recording_name`,
  the CPU flags digest and the jaxlib version; XLA:CPU's results depend on
  both, and 30 epochs grow the last bits into other models, so each machine
  keeps its own): ``results.jsonl`` (its rows as written), ``claims.json``
  (its claims with their verdicts) and ``machine.json`` (the machine). The
  recordings of other machines are left as they are: a change of results on
  purpose is recorded on every machine type CI runs on;
- the full grid of ``make demo`` (``configs/benchmark_digits.py``), and writes
  ``tests/benchmark/expected/demo/claim_rows.jsonl`` (the per-seed values its
  claims read, :func:`calib_jax.benchmark.report.claim_rows`) and ``run.json``
  (the grid, the ``results.jsonl`` sha256 and the wall time), then rewrites
  the README's claims summary between ``<!-- claims:begin -->`` and
  ``<!-- claims:end -->`` from them.

A commit that changes benchmark results on purpose runs this and says in its
message why the results moved. ``--quick_workdir DIR`` / ``--demo_workdir DIR``
run in ``DIR`` instead: a finished run of that config is read back, not
recomputed (the README then states no wall time for the demo), and a workdir
of another config is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags
from etils import epath

from calib_jax import storage
from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import paper_claims, report, reproducibility, runner
from calib_jax.train.cli import fail, parse_flags

ROOT = epath.Path(__file__).resolve().parent.parent
EXPECTED = ROOT / "tests" / "benchmark" / "expected"
README = ROOT / "README.md"
QUICK_CONFIG = "configs/benchmark_digits.py:quick"
DEMO_CONFIG = "configs/benchmark_digits.py"
BEGIN = "<!-- claims:begin: written by `make update-expected`, do not edit -->"
END = "<!-- claims:end -->"

_QUICK = flags.DEFINE_string(
    "quick_workdir", "", "Workdir of the quick benchmark (default: a new one)."
)
_DEMO = flags.DEFINE_string(
    "demo_workdir", "", "Workdir of the demo grid (default: a new one)."
)


def run_benchmark(config: str, workdir: epath.Path) -> dict:
    """Runs (or resumes) ``python -m calib_jax.benchmark`` on the CPU.

    Returns its timing (``wall_seconds``, ``cpus``, ``load_average`` at the
    start) when ``workdir`` was new, ``{}`` when it held a run already (the
    benchmark refuses a workdir of another config, and reads finished cells
    back).
    """
    fresh = not workdir.exists() or not any(workdir.iterdir())
    timing = {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "calib_jax.benchmark", "--config", config]
    command += ["--workdir", str(workdir)]
    start = time.monotonic()
    done = subprocess.run(command, check=False, cwd=ROOT, env=env)
    if done.returncode:
        fail(f"the benchmark {config} in {workdir} exited with {done.returncode}")
    timing["wall_seconds"] = time.monotonic() - start
    return timing if fresh else {}


def write_quick(results: epath.Path) -> None:
    here = reproducibility.machine()
    out = EXPECTED / "quick" / reproducibility.recording_name(here)
    storage.make_dirs(out)
    storage.write_bytes(out / runner.RESULTS_FILE, results.read_bytes())
    text = json.dumps(here, indent=1, sort_keys=True)
    storage.write_text(out / reproducibility.MACHINE_FILE, text + "\n")
    entries = paper_claims.claims(storage.read_jsonl(results))
    text = json.dumps(entries, indent=1, ensure_ascii=False)
    storage.write_text(out / "claims.json", text + "\n")


def write_demo(results: epath.Path, timing: dict) -> dict:
    """Writes the demo's kept rows and ``run.json``; returns the latter's content."""
    rows = agg.Rows(storage.read_jsonl(results))
    config = json.loads((results.parent / runner.CONFIG_FILE).read_text())
    run = {
        "config": DEMO_CONFIG,
        "dataset": config["train"]["dataset"]["name"],
        "model": config["train"]["model"]["name"],
        "num_epochs": config["train"]["num_epochs"],
        "methods": len(agg.methods(rows)),
        "calibrators": len(agg.calibrators(rows)),
        "seeds": sorted({r["seed"] for r in rows}),
        "rows": len(rows),
        "results_sha256": hashlib.sha256(results.read_bytes()).hexdigest(),
        **timing,
    }
    out = EXPECTED / "demo"
    storage.make_dirs(out)
    kept = report.claim_rows(rows)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
    storage.write_text(out / "claim_rows.jsonl", text)
    storage.write_text(out / "run.json", json.dumps(run, indent=1) + "\n")
    return run


def write_readme(run: dict) -> None:
    rows = storage.read_jsonl(EXPECTED / "demo" / "claim_rows.jsonl")
    block = report.claims_summary(paper_claims.claims(rows), run)
    text = README.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        fail(f"{README} needs one {BEGIN!r} line and one {END!r} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    storage.write_text(README, "\n".join([head + BEGIN, *block, END]) + tail)


def main(argv):
    del argv
    base = None
    if not (_QUICK.value and _DEMO.value):
        base = epath.Path(tempfile.mkdtemp(prefix="update_expected_"))
    quick = storage.as_path(_QUICK.value or base / "quick", what="--quick_workdir")
    demo = storage.as_path(_DEMO.value or base / "demo", what="--demo_workdir")
    print(f"quick benchmark in {quick}, demo in {demo}")
    run_benchmark(QUICK_CONFIG, quick)
    timing = run_benchmark(DEMO_CONFIG, demo)
    write_quick(quick / runner.RESULTS_FILE)
    run = write_demo(demo / runner.RESULTS_FILE, timing)
    write_readme(run)
    print(f"wrote {EXPECTED} and the claims summary of {README}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
