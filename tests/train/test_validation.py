"""calib_jax.train.validate: a training config checked before any compute or write."""

from __future__ import annotations

import pytest

from calib_jax import data, train
from calib_jax.benchmark import runner
from configs import benchmark_digits, digits_ce, digits_interleaved, digits_two_stage


def test_a_valid_config_passes_and_gives_its_dataset():
    dataset = train.validate(digits_ce.get_config())
    assert isinstance(dataset, data.Dataset) and dataset.name == "digits"
    assert dataset.num_classes == 10


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: setattr(c, "seed", -1), r"config.seed must be >= 0, got -1"),
        (
            lambda c: setattr(c.dataset, "name", "mnist"),
            r"Unknown dataset 'mnist'",
        ),
        (lambda c: setattr(c, "batch_size", 12), r"batch_size=12 is not divisible"),
        (
            lambda c: setattr(c, "loss", ({"name": "focal", "gama": 2.0},)),
            r"Loss 'focal' has no hyperparameter 'gama'",
        ),
        (lambda c: setattr(c.loss, "terms", ("xent",)), r"config.loss.terms names"),
        (
            lambda c: setattr(c, "loss", ({"name": "xent"},)),
            r"Unknown loss 'xent'. Valid names: ",
        ),
        (lambda c: setattr(c.model, "name", "resnet7"), r"Unknown model 'resnet7'"),
        (lambda c: setattr(c, "augment", "rotate"), r"Unknown config.augment 'rotate'"),
        (
            lambda c: setattr(c.shifts, "corruptions", "fog"),
            r"Unknown corruption\(s\) fog",
        ),
        (lambda c: setattr(c.ood, "dataset", "nope"), r"nope"),
    ],
)
def test_each_kind_of_mistake_is_one_line(change, message):
    config = digits_ce.get_config()
    change(config)
    with pytest.raises(ValueError, match=message) as info:
        train.validate(config)
    assert "\n" not in str(info.value)


def test_interleaved_secondary_terms_are_checked_naming_the_field():
    config = digits_interleaved.get_config()
    config.interleaved.secondary.sb_ece.temperature = 0.0
    with pytest.raises(ValueError, match=r"sb_ece.temperature"):
        train.validate(config)
    config = digits_interleaved.get_config()
    config.interleaved.secondary.terms = ("mdca",)
    with pytest.raises(ValueError, match=r"config.interleaved.secondary.terms names"):
        train.validate(config)


def test_stage_two_numbers_are_checked_without_a_stage_one_run(tmp_path):
    config = digits_two_stage.get_config(f"stage1={tmp_path / 'missing'}")
    train.validate(config)  # the stage-I run is the build's to read
    config.two_stage.q0 = 1.5
    with pytest.raises(ValueError, match=r"two_stage.q0 must lie in \[0, 1\], got 1.5"):
        train.validate(config)


def test_the_benchmark_validates_every_cell_through_it(tmp_path):
    config = benchmark_digits.get_config("quick")
    config.methods = ("two_stage",)  # its stage I (ce) is validated too
    config.train.model.name = "resnet7"
    with pytest.raises(ValueError, match=r"Unknown model 'resnet7'"):
        runner.validate(config, tmp_path / "w")
    config = benchmark_digits.get_config("quick")
    config.two_stage.update({"num_epochs": 0.0, "num_steps": 0})
    with pytest.raises(ValueError, match=r"Set config.num_steps or config.num_epochs"):
        runner.validate(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()
