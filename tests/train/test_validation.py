"""calib_jax.train.validate: a training config checked before any compute or write."""

from __future__ import annotations

import math

import pytest

from calib_jax import _memory, data, train
from calib_jax.train import validation
from calib_jax.benchmark import runner
from configs import (
    benchmark_digits,
    digits_ce,
    digits_interleaved,
    digits_soft_calibration,
    digits_two_stage,
)


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


@pytest.mark.parametrize("weight", [math.nan, math.inf, -1.0, -1e-9])
def test_a_loss_weight_must_be_finite_and_not_negative(weight):
    config = digits_ce.get_config()
    config.loss.cross_entropy.weight = weight
    with pytest.raises(ValueError) as err:
        train.validate(config)
    assert str(err.value) == (
        "loss term 'cross_entropy': weight must be a finite number >= 0 (0 "
        f"switches the term off), got {weight}."
    )


def test_a_zero_weight_switches_a_term_off_and_repeats_are_named_by_key():
    config = digits_ce.get_config()
    config.loss = ({"name": "cross_entropy"}, {"name": "focal", "weight": 0.0})
    train.validate(config)
    config.loss = ({"name": "focal"}, {"name": "focal", "weight": -2.0})
    with pytest.raises(ValueError, match=r"^loss term 'focal_2': weight must be"):
        train.validate(config)


def test_a_bin_count_that_cannot_fit_is_one_line_before_compute(monkeypatch):
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 10**9)
    config = digits_soft_calibration.get_config()
    config.loss.sb_ece.num_bins = 10_000_000
    with pytest.raises(ValueError) as err:
        train.validate(config)
    message = str(err.value)
    assert message.startswith(
        "config.loss.sb_ece.num_bins=10000000 (the loss term and its gradient on "
        "16 rows per device) needs about "
    ), message
    assert message.endswith(
        " GB; this device has 1.0 GB available; lower config.loss.sb_ece.num_bins."
    )
    # XLA's estimate: at least the [16, 1e7] float32 memberships.
    needed = float(message.split("needs about ")[1].split(" GB")[0])
    assert needed * 1e9 >= 0.99 * 4 * 16 * 10_000_000


def test_a_usual_bin_count_is_not_compiled_for_its_memory(monkeypatch):
    def measured(*args):
        raise AssertionError("measured")

    monkeypatch.setattr(validation, "_term_bytes", measured)
    config = digits_soft_calibration.get_config()
    train.validate(config)  # 15 bins
    config.loss.sb_ece.num_bins = 10_000_000
    with pytest.raises(AssertionError, match="measured"):
        train.validate(config)
