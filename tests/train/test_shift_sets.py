"""Shift and OOD sets of a config (``calib_jax.train.evaluate``): presets, order, errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.train import evaluate as eval_lib
from configs import digits_ce

# The 15 of Hendrycks & Dietterich (2019), Table/Fig. 1 order, and the 4 extras.
PAPER15 = [
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
]
EXTRA = ["speckle_noise", "gaussian_blur", "spatter", "saturate"]


def test_presets_on_the_published_release_names():
    known = sorted(PAPER15 + EXTRA)
    assert len(known) == 19
    assert eval_lib.select_corruptions("all", known, published=True) == known
    assert eval_lib.select_corruptions("standard15", known, published=True) == PAPER15
    assert eval_lib.select_corruptions(" none ", known, published=True) == []


def test_standard15_under_the_tfds_build_names():
    tfds_names = {"glass_blur": "frosted_glass_blur", "elastic_transform": "elastic"}
    known = sorted(tfds_names.get(n, n) for n in PAPER15 + EXTRA)
    got = eval_lib.select_corruptions("standard15", known, published=True)
    assert got == [tfds_names.get(n, n) for n in PAPER15]


def test_standard15_needs_all_15_of_a_published_set():
    known = sorted(set(PAPER15) - {"fog", "snow"})
    with pytest.raises(ValueError) as err:
        eval_lib.select_corruptions("standard15", known, published=True)
    message = str(err.value)
    assert "missing: snow, fog (found 13 of 15)" in message and "\n" not in message


def test_standard15_of_the_jax_corruptions_is_the_8_they_implement():
    known = list(data.corruptions.CORRUPTIONS)
    got = eval_lib.select_corruptions("standard15", known, published=False)
    assert got == [
        "gaussian_noise",
        "shot_noise",
        "impulse_noise",
        "defocus_blur",
        "brightness",
        "contrast",
        "pixelate",
        "jpeg_like",  # the JAX stand-in for jpeg_compression
    ]
    assert eval_lib.select_corruptions("all", known, published=False) == known


def test_unknown_corruption_names_the_presets():
    with pytest.raises(ValueError, match="Unknown corruption.s. fogg among the JAX"):
        eval_lib.select_corruptions("contrast,fogg", ["contrast"], published=False)
    with pytest.raises(ValueError, match="or a preset: all, standard15"):
        eval_lib.select_corruptions("standard14", ["contrast"], published=True)


def test_resolve_shifts_keeps_the_config_order_and_skips_absent_published_sets(
    tmp_path,
):
    root = tmp_path / "CIFAR-10-C"
    root.mkdir()
    np.save(root / "fog.npy", np.zeros((10, 32, 32, 3), np.uint8))
    np.save(root / "contrast.npy", np.zeros((10, 32, 32, 3), np.uint8))
    np.save(root / "labels.npy", np.zeros(2, np.uint8))
    config = digits_ce.get_config()
    config.shifts.dataset = "cifar10_corrupted"
    config.shifts.data_dir = str(root)
    config.shifts.corruptions = "fog,contrast"
    config.shifts.severities = (4, 2)
    got = [(c, s) for _, c, s in eval_lib.resolve_shifts(config, None)]
    assert got == [("fog", 4), ("fog", 2), ("contrast", 4), ("contrast", 2)]
    config.shifts.corruptions = "all"
    got = [(c, s) for _, c, s in eval_lib.resolve_shifts(config, None)]
    assert got[0] == ("contrast", 4)  # 'all' of a published set: sorted names


def test_ood_set_of_another_image_shape_is_refused(tmp_path):
    config = digits_ce.get_config()
    config.ood.dataset = "svhn_cropped"
    config.ood.data_dir = str(tmp_path)
    digits = data.get_dataset("digits")
    with tfds.testing.mock_data(num_examples=4), pytest.raises(ValueError) as err:
        eval_lib.resolve_ood(config, digits)
    assert str(err.value) == (
        "config.ood.dataset 'svhn_cropped' has images of shape (32, 32, 3); the "
        "model of digits takes (8, 8, 1)."
    )
    config.ood.dataset = "digits_patches"
    assert eval_lib.resolve_ood(config, digits).image_shape == (8, 8, 1)
    config.ood.dataset = ""
    assert eval_lib.resolve_ood(config, digits) is None


@pytest.mark.long
def test_score_is_a_function_of_the_logits_with_the_mean_in_set_order():
    rng = np.random.default_rng(0)

    def logits(n=50):
        return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 4, n)

    sets = {
        "test": logits(),
        "shift/b/1": logits(),
        "shift/a/2": logits(),
        "ood": (rng.normal(size=(30, 4)).astype(np.float32), np.full(30, -1)),
    }
    got = eval_lib.score(sets)
    assert list(got)[:6] == [f"test/{m}" for m in eval_lib.SPLIT_METRICS]
    assert list(got)[-4:] == [f"ood/{m}" for m in eval_lib.OOD_METRICS]
    ece = [got["shift/b/1/ece"], got["shift/a/2/ece"]]
    assert got["shift/mean/ece"] == float(np.mean(ece))

    def msp(z):
        return np.max(np.exp(z) / np.exp(z).sum(1, keepdims=True), 1)

    s_in, s_out = msp(sets["test"][0]), msp(sets["ood"][0])
    pairs = (s_in[:, None] > s_out[None]) + 0.5 * (s_in[:, None] == s_out[None])
    assert got["ood/auroc"] == pytest.approx(pairs.mean(), abs=1e-6)
