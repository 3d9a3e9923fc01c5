"""The CIFAR benchmark configs end to end on mock TFDS data (no download)."""

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax.benchmark import runner
from configs import benchmark_cifar10, benchmark_cifar100


# Slow (two CIFAR trainings of a CNN each): run by `make test-slow`, which CI runs.
@pytest.mark.slow
@pytest.mark.parametrize(
    "module, classes", [(benchmark_cifar10, 10), (benchmark_cifar100, 100)]
)
def test_cifar_benchmark_runs_on_mock_data_with_published_shifts(
    module, classes, tmp_path
):
    data_dir = tmp_path / "data"
    c = module.get_config("runlocal,seeds=1")
    if classes == 10:  # CIFAR-10-C: a TFDS dataset (mocked below)
        (data_dir / "cifar10_corrupted" / "contrast_5" / "1.0.0").mkdir(parents=True)
    else:  # CIFAR-100-C: the published .npy directory, a tiny fake one
        npy = tmp_path / "CIFAR-100-C"
        npy.mkdir()
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (5 * 12, 32, 32, 3), dtype=np.uint8)
        np.save(npy / "contrast.npy", images)
        np.save(npy / "labels.npy", np.arange(12, dtype=np.uint8) * 7 % 100)
        c.train.shifts.data_dir = str(npy)
    c.methods = ("ce", "two_stage")
    c.calibrators = ("none", "ts:nll")
    c.train.dataset.data_dir = str(data_dir)
    c.train.shifts.severities = (5,)
    with tfds.testing.mock_data(
        num_examples=32, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        runner.run(c, tmp_path / "w")
    rows = [json.loads(x) for x in (tmp_path / "w" / "results.jsonl").open()]
    # 2 methods x 2 calibrators x 1 seed x (clean + the one published shift)
    assert len(rows) == 8
    assert {r["shift"] for r in rows} == {"clean", "contrast/5"}
    assert all(np.isfinite(r["nll"]) and 0 <= r["ece"] <= 1 for r in rows)
    with np.load(
        tmp_path / "w" / "cells" / "ce" / "seed0" / "train" / "logits" / "test.npz"
    ) as f:
        assert f["logits"].shape[1] == classes
    assert "## Claims" in (tmp_path / "w" / "report.md").read_text()
