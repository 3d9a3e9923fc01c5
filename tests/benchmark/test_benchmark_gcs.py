"""The benchmark with a gs:// workdir equals the same benchmark on a local disk.

Cells (training runs, two-stage's stage I included), rows, results.jsonl, the
report and its PNG plots all go to the bucket of the GCS API emulator
(tests/_gcs.py); nothing is written under the working directory.
"""

from __future__ import annotations

import json
import os

import pytest

from calib_jax.benchmark import runner
from configs import benchmark_digits


def _config():
    c = benchmark_digits.get_config()
    c.methods = ("ce", "two_stage")
    c.calibrators = ("none", "ts:nll")
    c.seeds = (0,)
    c.train.num_steps = 12
    c.train.shifts.corruptions = "gaussian_noise"
    c.train.shifts.severities = (3,)
    c.two_stage.num_steps = 6
    return c


# Four short trainings (about a minute on a shared 2-core machine).
@pytest.mark.slow
def test_benchmark_on_a_bucket_equals_the_local_run(
    gcs_emulator, gcs_bucket, tmp_path, monkeypatch
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    local = tmp_path / "local"
    runner.run(_config(), local)
    report = runner.run(_config(), f"{gcs_bucket}/bench")
    assert os.fspath(report) == f"{gcs_bucket}/bench/report.md"

    bucket = gcs_bucket[len("gs://") :]
    names = gcs_emulator.objects(bucket, "bench/")
    for expected in (
        "bench/benchmark_config.json",
        "bench/results.jsonl",
        "bench/report.md",
        "bench/ece_vs_severity.png",
        "bench/accuracy_vs_ece.png",
        "bench/reliability_best.png",
        "bench/cells/ce/seed0/rows.jsonl",
        "bench/cells/ce/seed0/train/TRAINED",
        "bench/cells/ce/seed0/train/logits/test.npz",
        "bench/cells/two_stage/seed0/train/config.json",
    ):
        assert expected in names, expected
    # Stage II read its stage-I run from the bucket.
    stage2 = json.loads(
        gcs_emulator.read(bucket, "bench/cells/two_stage/seed0/train/config.json")
    )
    assert stage2["two_stage"]["stage1_workdir"] == (
        f"{gcs_bucket}/bench/cells/ce/seed0/train"
    )
    # Same rows and the same report, whichever storage held the run.
    for name in ("results.jsonl", "report.md"):
        remote = gcs_emulator.read(bucket, f"bench/{name}")
        assert remote == (local / name).read_bytes(), name
    png = gcs_emulator.read(bucket, "bench/accuracy_vs_ece.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # A rerun reads the finished cells back from the bucket.
    before = gcs_emulator.read(bucket, "bench/results.jsonl")
    runner.run(_config(), f"{gcs_bucket}/bench")
    assert gcs_emulator.read(bucket, "bench/results.jsonl") == before
    assert list(cwd.iterdir()) == []
