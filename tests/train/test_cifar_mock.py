"""CIFAR training end to end on mock TFDS data (no download, no TensorFlow)."""

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax.train import evaluate, loop
from configs import cifar10_resnet110, cifar100_preresnet56


def _mock(n):
    return tfds.testing.mock_data(
        num_examples=n, policy=tfds.testing.MockPolicy.USE_CODE
    )


def _small(config, data_dir):
    config.model.name = (
        "cnn"  # compiles in seconds on CPU; ResNets are tested in models
    )
    config.dataset.data_dir = str(data_dir)
    config.num_steps = 3
    config.batch_size = 16
    config.eval_batch_size = 16
    config.log_every = 1
    config.checkpoint_every = 2
    return config


@pytest.mark.long
@pytest.mark.parametrize(
    "module, classes", [(cifar10_resnet110, 10), (cifar100_preresnet56, 100)]
)
def test_cifar_runs_a_few_steps_with_augmentation_and_jax_shifts(
    module, classes, tmp_path
):
    config = _small(module.get_config("objective=sb_ece"), tmp_path / "data")
    config.shifts.corruptions = "gaussian_noise,pixelate"
    config.shifts.severities = (2,)
    with _mock(40):
        summary = loop.train_and_evaluate(config, tmp_path / "w")
    rows = [
        json.loads(x)
        for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if "loss/total" in r] == [1, 2, 3]
    assert all(np.isfinite(r["loss/sb_ece"]) for r in rows if "loss/sb_ece" in r)
    for key in (
        "test/accuracy",
        "test/ece",
        "shift/gaussian_noise/2/ece",
        "shift/mean/nll",
    ):
        assert np.isfinite(summary[key])
    with np.load(tmp_path / "w" / "logits" / "test.npz") as f:
        assert f["logits"].shape == (40, classes)
    # The end-of-run metrics, scored batch by batch on the devices, equal
    # scoring the exported logits of every set bit for bit.
    keys = [k for k in summary if k.endswith("/accuracy") and "/mean/" not in k]
    sets = [k[: -len("/accuracy")] for k in keys]
    expected = evaluate.score(evaluate.read_logits(tmp_path / "w" / "logits", sets))
    assert len(sets) == 4 and list(summary)[: len(expected)] == list(expected)
    for key, value in expected.items():
        assert summary[key] == value, (key, summary[key], value)


@pytest.mark.long
def test_cifar10_with_published_cifar10_c_shifts(tmp_path):
    data_dir = tmp_path / "data"
    for name in ("gaussian_noise_3", "contrast_5"):
        (data_dir / "cifar10_corrupted" / name / "1.0.0").mkdir(parents=True)
    config = _small(cifar10_resnet110.get_config(), data_dir)
    config.shifts.dataset = "cifar10_corrupted"
    config.shifts.severities = (3, 5)
    with _mock(24):
        summary = loop.train_and_evaluate(config, tmp_path / "w")
    # Exactly the published (corruption, severity) pairs present on disk.
    shifted = sorted(
        k for k in summary if k.startswith("shift/") and k.endswith("/ece")
    )
    assert shifted == [
        "shift/contrast/5/ece",
        "shift/gaussian_noise/3/ece",
        "shift/mean/ece",
    ]
