"""Decoding splits once: in memory, or into a checked .npy cache that is never read wrong."""

import json
import logging

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.data import ArraySource, cache, pipeline
from calib_jax.data._sources import SubsetSource


class CountingSource:
    """A per-record source (no arrays) that counts its reads."""

    def __init__(self, images, labels, key="test:counting"):
        self.images_, self.labels_ = images, labels
        self.cache_key = key
        self.reads = 0

    def __len__(self):
        return len(self.labels_)

    def __getitem__(self, i):
        self.reads += 1
        return {"image": self.images_[i], "label": int(self.labels_[i])}


def _source(n=50, shape=(4, 5, 3), seed=0, **kw):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    return CountingSource(images, rng.integers(0, 100, n), **kw)


def _assert_same(decoded, source):
    np.testing.assert_array_equal(decoded.images, source.images_)
    np.testing.assert_array_equal(decoded.labels, source.labels_)
    assert decoded.images.dtype == np.uint8 and decoded.labels.dtype == np.int32


@pytest.mark.parametrize("workers", [1, 3])
def test_decode_reads_every_record_once(workers):
    source = _source()
    images, labels = cache.decode(source, workers=workers)
    assert source.reads == 1 + len(source)  # record 0 once for the shape
    np.testing.assert_array_equal(images, source.images_)
    np.testing.assert_array_equal(labels, source.labels_)


def test_decode_rejects_records_of_another_shape():
    source = _source()
    source.images_ = list(source.images_)
    source.images_[7] = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="Record 7"):
        cache.decode(source, workers=2)


def test_in_memory_split_is_decoded_once_per_run():
    store = cache.SplitCache(memory_bytes=1 << 30)
    source = _source()
    first = store.get(source)
    reads = source.reads
    assert reads == 2 + len(source)  # size probe, shape, then every record
    _assert_same(first, source)
    assert store.get(source) is first and source.reads == reads
    assert store.held_bytes == source.images_.nbytes
    # Array sources are used as they are; subsets keep their indices.
    arrays = ArraySource(source.images_, source.labels_)
    assert store.get(arrays) is arrays
    subset = store.get(SubsetSource(source, np.array([4, 1])))
    assert subset.source is first and source.reads == reads
    np.testing.assert_array_equal(
        pipeline.gather(subset, [0, 1])["image"], source.images_[[4, 1]]
    )


def test_disk_cache_is_built_once_then_reused_without_decoding(tmp_path):
    source = _source()
    store = cache.SplitCache(memory_bytes=0, cache_dir=tmp_path)
    built = store.get(source)
    _assert_same(built, source)
    assert isinstance(built.images, np.memmap)
    [directory] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert sorted(p.name for p in directory.iterdir()) == [
        "images.npy",
        "labels.npy",
        "meta.json",
    ]
    assert store.held_bytes == 0
    # A new run: the cache is checked (first and last records) and read.
    again = _source()
    reused = cache.SplitCache(memory_bytes=0, cache_dir=tmp_path).get(again)
    assert again.reads == 1 + 2  # size probe + the two fingerprint records
    _assert_same(reused, again)


def _build(tmp_path, **kw):
    source = _source(**kw)
    directory = cache.cache_path(tmp_path, source.cache_key)
    cache.open_or_build(source, directory)
    return directory


def _corrupt_shape(directory):
    np.save(directory / "images.npy", np.zeros((50, 4, 4, 3), np.uint8))


def _corrupt_dtype(directory):
    np.save(directory / "images.npy", np.zeros((50, 4, 5, 3), np.float32))


def _corrupt_labels(directory):
    np.save(directory / "labels.npy", np.zeros(49, np.int32))


def _truncate(directory):
    path = directory / "images.npy"
    path.write_bytes(path.read_bytes()[:-7])


def _meta_n(directory):
    meta = json.loads((directory / "meta.json").read_text())
    meta["num_examples"] = 40
    (directory / "meta.json").write_text(json.dumps(meta))


def _garbled_meta(directory):
    (directory / "meta.json").write_text("{not json")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_corrupt_shape, "images.npy holds"),
        (_corrupt_dtype, "images.npy holds"),
        (_corrupt_labels, "labels.npy holds"),
        (_truncate, "bytes, not"),
        (_meta_n, "num_examples"),
        (_garbled_meta, "unreadable meta.json"),
    ],
)
def test_a_cache_that_does_not_match_is_rebuilt_never_read(
    tmp_path, caplog, damage, reason
):
    directory = _build(tmp_path)
    damage(directory)
    source = _source()
    with caplog.at_level(logging.WARNING):
        decoded = cache.open_or_build(source, directory)
    assert source.reads == 2 + 1 + len(source)  # check, then a full decode
    _assert_same(decoded, source)
    [record] = [r for r in caplog.records if "rebuilding" in r.getMessage()]
    assert reason in record.getMessage() and str(directory) in record.getMessage()
    # The rebuilt cache is good again: no decode on the next open.
    again = _source()
    _assert_same(cache.open_or_build(again, directory), again)
    assert again.reads == 2


def test_a_cache_of_other_records_is_rebuilt(tmp_path, caplog):
    directory = _build(tmp_path, seed=0)
    other = _source(seed=1)  # same key, size and shape; other pixels
    with caplog.at_level(logging.WARNING):
        decoded = cache.open_or_build(other, directory)
    _assert_same(decoded, other)
    assert any("records_sha256" in r.getMessage() for r in caplog.records)
    wider = _source(shape=(4, 6, 3))
    _assert_same(cache.open_or_build(wider, directory), wider)


def test_splits_beyond_the_memory_budget_go_to_disk(tmp_path):
    a, b = _source(key="test:a"), _source(seed=2, key="test:b")
    store = cache.SplitCache(memory_bytes=a.images_.nbytes, cache_dir=tmp_path)
    assert not isinstance(store.get(a).images, np.memmap)  # fits
    assert isinstance(store.get(b).images, np.memmap)  # would exceed the budget
    assert store.held_bytes == a.images_.nbytes
    with pytest.raises(ValueError, match="config.input.cache_dir"):
        cache.SplitCache(memory_bytes=0).get(_source(key="test:c"))


def test_tfds_split_is_cached_beside_the_dataset(tmp_path):
    with tfds.testing.mock_data(
        num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        ds = data.get_dataset("cifar10", data_dir=str(tmp_path))
        source = ds.source("test")
        assert source.cache_key.startswith("tfds:cifar10/")
        decoded = cache.SplitCache(memory_bytes=0).get(source)
        assert isinstance(decoded.images, np.memmap)
        for i in (0, 5, 11):
            np.testing.assert_array_equal(decoded.images[i], source[i]["image"])
            assert decoded.labels[i] == source[i]["label"]
    assert (tmp_path / cache.DEFAULT_DIRNAME).is_dir()


def test_an_unwritable_cache_dir_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = cache.SplitCache(memory_bytes=0, cache_dir=blocker / "cache")
    with pytest.raises(ValueError, match="config.input.cache_dir") as err:
        store.get(_source())
    assert str(blocker) in str(err.value) and "\n" not in str(err.value)
