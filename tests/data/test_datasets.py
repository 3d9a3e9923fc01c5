"""Datasets: digits, TFDS CIFAR under mock_data, CIFAR-10-C dirs, CIFAR-100-C .npy.

``tfds.testing.mock_data`` works without TensorFlow for ``tfds.data_source``:
with no metadata files it falls back to ``MockPolicy.USE_CODE``, builds the
features from the dataset's builder code and serves random examples through
``__getitem__`` (integer indexing only). The data dir passed by the code is
ignored inside the context.
"""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.data import pipeline


def _mock(num_examples=10):
    return tfds.testing.mock_data(
        num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE
    )


def test_registry_and_errors(tmp_path):
    assert set(data.DATASETS) == {
        "digits",
        "cifar10",
        "cifar100",
        "cifar10_corrupted",
        "cifar100_corrupted",
    }
    with pytest.raises(ValueError, match="Valid datasets: digits, cifar10"):
        data.get_dataset("mnist")
    with pytest.raises(ValueError, match="Valid splits: train, val, test"):
        data.get_dataset("digits").source("validation")
    # No TFDS build in the data dir: the message says how to make one.
    for name in ("cifar10", "cifar100", "cifar10_corrupted"):
        with pytest.raises(
            ValueError, match=f"tfds build {name} --file_format=array_record"
        ):
            data.get_dataset(name, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="needs data_dir"):
        data.get_dataset("cifar100_corrupted")
    with pytest.raises(ValueError, match="labels.npy"):
        data.get_dataset("cifar100_corrupted", data_dir=str(tmp_path))


def test_digits():
    ds = data.get_dataset("digits")
    assert (ds.num_classes, ds.image_shape) == (10, (8, 8, 1))
    sizes = {s: len(ds.source(s)) for s in ds.splits}
    assert sizes == {"train": 1077, "val": 360, "test": 360}
    example = ds.source("test")[0]
    reference = data.load_digits("test")
    np.testing.assert_array_equal(example["image"], reference["image"][0])
    assert example["label"] == reference["label"][0]
    train = data.load_digits("train")["image"]
    np.testing.assert_allclose(ds.mean, [train.mean()], atol=1e-4)
    np.testing.assert_allclose(ds.std, [train.std()], atol=1e-4)
    shifts = ds.shifts()
    assert len(shifts) == 5 * len(data.corruptions.CORRUPTIONS)
    assert ("gaussian_noise", 1) in shifts and ("jpeg_like", 5) in shifts


@pytest.mark.parametrize("name, num_classes", [("cifar10", 10), ("cifar100", 100)])
def test_tfds_cifar_under_mock_data(name, num_classes, tmp_path):
    with _mock():
        ds = data.get_dataset(name, data_dir=str(tmp_path))
        assert ds.splits == ("train", "val", "test", "train_full")
        assert (ds.num_classes, ds.image_shape, len(ds.mean)) == (
            num_classes,
            (32, 32, 3),
            3,
        )
        example = ds.source("train")[3]
        assert example["image"].dtype == np.uint8 and example["image"].shape == (
            32,
            32,
            3,
        )
        assert isinstance(example["label"], int)
        batch = pipeline.train_batch(ds.source("train"), step=2, batch_size=4, seed=0)
        assert batch["image"].shape == (4, 32, 32, 3)
        assert batch["image"].dtype == np.float32 and batch["image"].max() <= 1.0
        assert np.all((batch["label"] >= 0) & (batch["label"] < num_classes))
        again = pipeline.train_batch(ds.source("train"), step=2, batch_size=4, seed=0)
        np.testing.assert_array_equal(batch["image"], again["image"])
        batches = list(pipeline.eval_batches(ds.source("test"), batch_size=4))
        assert [int(b["mask"].sum()) for b in batches] == [4, 4, 2]


def test_cifar_val_size_option(tmp_path):
    with _mock():
        ds = data.get_dataset("cifar10", data_dir=str(tmp_path), val_size=0)
        assert ds.splits == ("train", "test", "train_full")
        with pytest.raises(ValueError, match="val_size"):
            data.get_dataset("cifar10", data_dir=str(tmp_path), val_size=50_000)


def test_cifar10_corrupted_under_mock_data(tmp_path):
    # The configs present in the data dir decide the splits and shifts; the
    # records themselves come from mock_data.
    for config in ("gaussian_noise_3", "gaussian_noise_5", "fog_1"):
        (tmp_path / "cifar10_corrupted" / config / "1.0.0").mkdir(parents=True)
    (tmp_path / "cifar10_corrupted" / "not_a_config").mkdir()
    ds = data.get_dataset("cifar10_corrupted", data_dir=str(tmp_path))
    assert ds.shifts() == [("fog", 1), ("gaussian_noise", 3), ("gaussian_noise", 5)]
    assert ds.splits == ("fog_1", "gaussian_noise_3", "gaussian_noise_5")
    with _mock(num_examples=6):
        source = ds.source("gaussian_noise_3")
        assert len(source) == 6
        batches = list(pipeline.eval_batches(source, batch_size=4))
        assert batches[0]["image"].shape == (4, 32, 32, 3)
        assert [int(b["mask"].sum()) for b in batches] == [4, 2]


def _write_cifar100_c(root, corruptions=("contrast", "gaussian_noise"), n=4):
    """A tiny published-layout directory: pixel value = 10 * severity + row."""
    root.mkdir()
    rows = np.arange(5 * n)
    severity = rows // n + 1
    for k, name in enumerate(corruptions):
        value = (10 * severity + rows % n + 100 * k).astype(np.uint8)
        images = np.broadcast_to(value[:, None, None, None], (5 * n, 32, 32, 3))
        np.save(root / f"{name}.npy", np.ascontiguousarray(images))
    np.save(root / "labels.npy", (rows * 7 % 100).astype(np.uint8))


def test_cifar100_corrupted_npy_directory(tmp_path):
    root = tmp_path / "CIFAR-100-C"
    _write_cifar100_c(root)
    _check_cifar100_c(data.get_dataset("cifar100_corrupted", data_dir=str(root)))


def test_cifar100_corrupted_npy_directory_in_a_bucket(tmp_path, gcs_bucket):
    """The same files in gs://: headers, then only the opened severity's rows."""
    from calib_jax import storage

    local = tmp_path / "CIFAR-100-C"
    _write_cifar100_c(local)
    remote = f"{gcs_bucket}/CIFAR-100-C"
    for path in local.iterdir():
        storage.write_bytes(f"{remote}/{path.name}", path.read_bytes())
    ds = data.get_dataset("cifar100_corrupted", data_dir=remote)
    _check_cifar100_c(ds)
    source = ds.source("contrast_2")
    assert not isinstance(source.images, np.memmap) and source.images.shape[0] == 4


def _check_cifar100_c(ds):
    assert ds.num_classes == 100 and ds.image_shape == (32, 32, 3)
    assert ds.shifts() == [("contrast", s) for s in range(1, 6)] + [
        ("gaussian_noise", s) for s in range(1, 6)
    ]
    for corruption, offset in (("contrast", 0), ("gaussian_noise", 100)):
        for severity in (1, 3, 5):
            source = ds.source(f"{corruption}_{severity}")
            assert len(source) == 4
            for i in range(4):
                example = source[i]
                assert example["image"].dtype == np.uint8
                assert example["image"][0, 0, 0] == 10 * severity + i + offset
                assert example["label"] == ((severity - 1) * 4 + i) * 7 % 100
    batches = list(pipeline.eval_batches(ds.source("contrast_2"), batch_size=3))
    assert [int(b["mask"].sum()) for b in batches] == [3, 1]
    np.testing.assert_allclose(
        batches[0]["image"][:, 0, 0, 0] * 255, [20, 21, 22], atol=1e-3
    )


def test_cifar10_corrupted_reads_the_published_npy_directory(tmp_path):
    """CIFAR-10-C's release directory (labels.npy present) is read as CIFAR-100-C's."""
    root = tmp_path / "CIFAR-10-C"
    _write_cifar100_c(root, corruptions=("glass_blur", "contrast"))
    ds = data.get_dataset("cifar10_corrupted", data_dir=str(root))
    assert (ds.name, ds.num_classes, ds.image_shape) == (
        "cifar10_corrupted",
        10,
        (32, 32, 3),
    )
    assert ds.mean == data.dataset_info("cifar10").mean
    assert ds.shifts() == [("contrast", s) for s in range(1, 6)] + [
        ("glass_blur", s) for s in range(1, 6)
    ]
    source = ds.source("glass_blur_4")
    assert isinstance(source, data.NpySource) and len(source) == 4
    assert [source[i]["image"][0, 0, 0] for i in range(4)] == [40, 41, 42, 43]
    assert [source[i]["label"] for i in range(4)] == [
        (12 + i) * 7 % 100 for i in range(4)
    ]
    # A directory with neither layout names both.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError) as err:
        data.get_dataset("cifar10_corrupted", data_dir=str(tmp_path / "empty"))
    assert "no published CIFAR-10-C directory" in str(err.value)
    assert "tfds build cifar10_corrupted" in str(err.value)


def test_digits_patches_are_the_block_means_of_the_bundled_photographs():
    from sklearn.datasets import load_sample_images

    ood = data.get_ood_set("digits_patches")
    images = ood.source.images
    assert (ood.image_shape, ood.image_dtype) == ((8, 8, 1), "float32")
    assert images.shape == (2 * 13 * 20, 8, 8, 1) and images.dtype == np.float32
    assert np.all(ood.source.labels == -1)
    np.testing.assert_array_equal(images * 16, np.round(images * 16))  # 17 levels
    np.testing.assert_array_equal(
        images, data.get_ood_set("digits_patches").source.images
    )
    # Tiles by explicit loops (row-major over the grid, china.jpg first).
    photos = load_sample_images().images
    for index, (photo, r, c) in {0: (0, 0, 0), 27: (0, 1, 7), 519: (1, 12, 19)}.items():
        rgb = photos[photo].astype(np.float64)
        want = np.zeros((8, 8))
        for i in range(8):
            for j in range(8):
                total = 0.0
                for di in range(4):
                    for dj in range(4):
                        y, x = 32 * r + 4 * i + di, 32 * c + 4 * j + dj
                        red, green, blue = rgb[y, x]
                        total += 0.299 * red + 0.587 * green + 0.114 * blue
                want[i, j] = round(total / 16 / 255 * 16) / 16
        np.testing.assert_array_equal(images[index, :, :, 0], want)


def test_ood_sets_registry_and_errors(tmp_path):
    assert set(data.OOD_SETS) == {"digits_patches", "svhn_cropped"}
    with pytest.raises(ValueError, match="Unknown OOD set 'mnist'. Valid: digits_p"):
        data.get_ood_set("mnist")
    with pytest.raises(ValueError, match="tfds build svhn_cropped --file_format"):
        data.get_ood_set("svhn_cropped", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Valid splits: train, test, extra"):
        data.get_ood_set("svhn_cropped", split="validation")
    with _mock(num_examples=5):
        svhn = data.get_ood_set("svhn_cropped", data_dir=str(tmp_path))
        assert svhn.image_shape == (32, 32, 3) and len(svhn.source) == 5
        example = svhn.source[2]
        assert example["image"].shape == (32, 32, 3) and example["label"] == -1
        assert svhn.source.cache_key.endswith(":unlabelled")
        # Any registered dataset's split, unlabelled too.
        c100 = data.get_ood_set("cifar100", data_dir=str(tmp_path))
        assert c100.source[0]["label"] == -1 and c100.image_dtype == "uint8"


def test_cifar100_corrupted_rejects_bad_files(tmp_path):
    root = tmp_path / "bad"
    _write_cifar100_c(root, corruptions=("contrast",))
    np.save(root / "contrast.npy", np.zeros((7, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="shape"):
        data.get_dataset("cifar100_corrupted", data_dir=str(root))


def test_dataset_info_is_the_metadata_of_the_built_datasets(tmp_path):
    def meta(d):
        return d.name, d.num_classes, tuple(d.image_shape), d.mean, d.std

    assert set(data.INFO) == set(data.DATASETS)
    assert meta(data.dataset_info("digits")) == meta(data.get_dataset("digits"))
    with _mock():
        for name in ("cifar10", "cifar100", "cifar10_corrupted"):
            if name == "cifar10_corrupted":
                (tmp_path / name / "snow_3" / "3.0.1").mkdir(parents=True)
            built = data.get_dataset(name, data_dir=str(tmp_path))
            assert meta(data.dataset_info(name)) == meta(built), name
    _write_cifar100_c(tmp_path / "c100c")
    built = data.get_dataset("cifar100_corrupted", data_dir=str(tmp_path / "c100c"))
    assert meta(data.dataset_info("cifar100_corrupted")) == meta(built)
    assert data.dataset_info("cifar100").num_classes == 100
    assert data.dataset_info("cifar10").mean == (0.4914, 0.4822, 0.4465)
    with pytest.raises(ValueError, match="Unknown dataset 'mnist'. Valid datasets: "):
        data.dataset_info("mnist")
