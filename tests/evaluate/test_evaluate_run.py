"""``calib_jax.evaluate``: a run's checkpoint or logits scored without retraining.

The end-to-end test trains a CIFAR-10 CNN for a few steps on mock TFDS data
with a tiny fake CIFAR-10-C ``.npy`` directory and SVHN (mocked) as the OOD
set, then evaluates the run's checkpoint and its exported logits: both give
the trainer's end-of-run metrics bit for bit, and the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import evaluate
from calib_jax.train import loop
from configs import cifar10_resnet110

CORRUPTIONS = ("contrast", "gaussian_noise", "glass_blur")


def write_cifar10_c(root, corruptions=CORRUPTIONS, n=8):
    """A tiny published-layout CIFAR-10-C directory: 5 severities x ``n`` images."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in corruptions:
        images = rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
        np.save(root / f"{name}.npy", images)
    np.save(root / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8))


def small_config(data_dir, c10c):
    config = cifar10_resnet110.get_config()
    config.model.name = "cnn"  # compiles in seconds on CPU
    config.dataset.data_dir = str(data_dir)
    config.num_steps = 3
    config.batch_size = 16
    config.eval_batch_size = 16
    config.log_every = 1
    config.checkpoint_every = 2
    config.shifts.dataset = "cifar10_corrupted"
    config.shifts.data_dir = str(c10c)
    config.shifts.corruptions = "all"
    config.ood.dataset = "svhn_cropped"
    return config


def _final_row(workdir):
    rows = loop.load_jsonl(workdir / "metrics.jsonl")
    return {k: v for k, v in rows[-1].items() if k not in ("step", "time")}


def _npz(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
def test_evaluate_reproduces_the_trainers_end_of_run_metrics_and_logits(tmp_path):
    c10c = tmp_path / "CIFAR-10-C"
    write_cifar10_c(c10c)
    config = small_config(tmp_path / "data", c10c)
    run = tmp_path / "run"
    with tfds.testing.mock_data(
        num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        loop.train_and_evaluate(config, run, progress=False)
        trained = _final_row(run)
        got, out = evaluate.run(config, run, progress=False)
    out = Path(str(out))
    # 3 corruptions x 5 severities, their mean, val, test and the OOD set.
    shift_sets = {k.rsplit("/", 1)[0] for k in trained if k.startswith("shift/")}
    assert len(shift_sets) == 3 * 5 + 1
    assert {"ood/auroc", "ood/aupr_in", "ood/fpr_at_95_tpr"} <= set(trained)
    # Same keys in the same order, bit-equal floats.
    assert list(got) == list(trained)
    assert all(got[k] == trained[k] for k in trained)
    assert _final_row(out) == trained
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["metrics"] == trained and saved["source"] == "checkpoint"
    assert saved["step"] == 3
    # The logits files: the trainer's names, identical arrays.
    names = sorted(p.relative_to(run / "logits") for p in run.glob("logits/**/*.npz"))
    assert names == sorted(
        p.relative_to(out / "logits") for p in out.glob("logits/**/*.npz")
    )
    assert len(names) == 2 + 15 + 1
    for name in names:
        a, b = _npz(run / "logits" / name), _npz(out / "logits" / name)
        assert a.keys() == b.keys() == {"logits", "labels"}
        for key in a:
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key], b[key])
    ood = _npz(run / "logits" / "ood" / "svhn_cropped.npz")
    assert ood["logits"].shape == (24, 10) and np.all(ood["labels"] == -1)
    for plot in ("reliability_val.png", "reliability_test.png", "ece_vs_severity.png"):
        assert (out / "plots" / plot).read_bytes()[:4] == b"\x89PNG"

    # The exported logits alone (no checkpoint, no data) give the same numbers.
    from_logits, _ = evaluate.run(
        config, run, out=tmp_path / "from_logits", from_logits=True, progress=False
    )
    assert list(from_logits) == list(trained)
    assert all(from_logits[k] == trained[k] for k in trained)

    # Never over an earlier evaluation without overwrite.
    with pytest.raises(ValueError, match="already holds an evaluation"):
        evaluate.run(config, run, from_logits=True, progress=False)
