"""Host pipeline: (seed, step)-determined training batches, padded eval batches."""

import jax
import numpy as np
import pytest

from calib_jax.data import ArraySource, augment, pipeline
from calib_jax.data._sources import SubsetSource


def _source(n=23, dtype=np.uint8):
    """Images whose pixels all equal the example index; label = index."""
    images = np.broadcast_to(np.arange(n)[:, None, None, None], (n, 4, 4, 3))
    return ArraySource(images.astype(dtype), np.arange(n))


def test_train_batch_format():
    batch = pipeline.train_batch(_source(), step=0, batch_size=8, seed=0)
    assert batch["image"].shape == (8, 4, 4, 3) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32
    # uint8 sources are scaled to [0, 1]; the image still encodes the label.
    np.testing.assert_allclose(
        batch["image"][:, 0, 0, 0] * 255, batch["label"], atol=1e-4
    )
    floats = pipeline.train_batch(
        _source(dtype=np.float32), step=0, batch_size=8, seed=0
    )
    np.testing.assert_array_equal(floats["image"][:, 0, 0, 0], batch["label"])


def test_train_batch_depends_only_on_seed_and_step():
    source = _source()
    kw = {"batch_size": 8, "seed": 3}
    first = [pipeline.train_batch(source, step=s, **kw)["label"] for s in range(10)]
    # "Resume" at step 6 with a cold permutation cache: identical batches.
    pipeline._permutation.cache_clear()
    for s in (6, 7, 8, 9):
        np.testing.assert_array_equal(
            pipeline.train_batch(source, step=s, **kw)["label"], first[s]
        )
    other = pipeline.train_batch(source, step=0, batch_size=8, seed=4)["label"]
    assert not np.array_equal(other, first[0])


def test_every_epoch_is_a_permutation():
    n, b = 23, 8  # batches straddle epoch boundaries
    stream = np.concatenate(
        [
            pipeline.train_batch(_source(n), step=s, batch_size=b, seed=0)["label"]
            for s in range(3 * n)  # b * 3n positions = 3b epochs
        ]
    )
    epochs = stream.reshape(-1, n)
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(epoch), np.arange(n))
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled every epoch
    expected = np.random.default_rng([0, 1]).permutation(n)
    np.testing.assert_array_equal(epochs[1], expected)


@pytest.mark.parametrize("count", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(count):
    source = _source()
    whole = pipeline.train_batch(source, step=5, batch_size=8, seed=1)
    parts = [
        pipeline.train_batch(
            source, step=5, batch_size=8, seed=1, process_index=i, process_count=count
        )
        for i in range(count)
    ]
    for key in ("image", "label"):
        np.testing.assert_array_equal(
            np.concatenate([p[key] for p in parts]), whole[key]
        )


def test_invalid_arguments():
    with pytest.raises(ValueError, match="divisible"):
        pipeline.train_batch(_source(), step=0, batch_size=6, seed=0, process_count=4)
    with pytest.raises(ValueError, match="process_index"):
        pipeline.train_batch(
            _source(), step=0, batch_size=8, seed=0, process_index=2, process_count=2
        )
    with pytest.raises(ValueError, match="empty"):
        pipeline.train_batch(_source(0), step=0, batch_size=8, seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        pipeline.train_batch(_source(), step=0, batch_size=8, seed=-1)


@pytest.mark.parametrize(
    "n, batch_size, count", [(23, 8, 1), (23, 8, 2), (16, 8, 4), (3, 8, 4)]
)
def test_eval_batches_cover_every_example_once(n, batch_size, count):
    source = _source(n)
    per_process = [
        list(
            pipeline.eval_batches(
                source, batch_size=batch_size, process_index=i, process_count=count
            )
        )
        for i in range(count)
    ]
    num_batches = -(-n // batch_size)
    assert all(len(p) == num_batches for p in per_process)
    seen = []
    for b in range(num_batches):
        # The global batch is the processes' slices in process order.
        glob = {
            k: np.concatenate([p[b][k] for p in per_process])
            for k in ("image", "label", "mask")
        }
        assert glob["mask"].dtype == bool and len(glob["mask"]) == batch_size
        assert glob["image"].dtype == np.float32
        np.testing.assert_array_equal(glob["image"][~glob["mask"]], 0.0)
        np.testing.assert_array_equal(glob["label"][~glob["mask"]], 0)
        seen.extend(glob["label"][glob["mask"]])
    np.testing.assert_array_equal(seen, np.arange(n))


def test_eval_batches_of_an_empty_source():
    assert list(pipeline.eval_batches(_source(0), batch_size=4)) == []


class _Records:
    """Per-record view of an ArraySource (no arrays exposed): the old read path."""

    def __init__(self, source):
        self._source = source

    def __len__(self):
        return len(self._source)

    def __getitem__(self, i):
        return self._source[i]


def _random_source(n=37, shape=(5, 4, 3), dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    else:
        images = rng.random((n, *shape)).astype(dtype)
    return ArraySource(images, rng.integers(0, 10, n))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_gathered_uint8_batches_converted_on_device_equal_the_per_record_path(
    dtype, count
):
    arrays = _random_source(dtype=dtype)
    records = _Records(arrays)
    assert pipeline.gather(arrays, [3])["image"].dtype == dtype
    convert = jax.jit(augment.to_float)
    for seed in (0, 5):
        for step in (0, 1, 4, 9):  # 9 * 8 > 37: later epochs and straddling batches
            for i in range(count):
                kw = {
                    "step": step,
                    "batch_size": 8,
                    "seed": seed,
                    "process_index": i,
                    "process_count": count,
                }
                old = pipeline.train_batch(records, **kw)  # per record, host float
                new = pipeline.train_batch(arrays, to_float=False, **kw)
                assert new["image"].dtype == dtype
                np.testing.assert_array_equal(new["label"], old["label"])
                assert old["image"].dtype == np.float32
                device = np.asarray(convert(new["image"]))
                assert device.dtype == np.float32
                np.testing.assert_array_equal(
                    device.view(np.uint32), old["image"].view(np.uint32)
                )


def test_gather_through_subset_views_equals_per_record_reads():
    arrays = _random_source()
    inner = SubsetSource(arrays, np.arange(3, 30))
    outer = SubsetSource(inner, np.array([26, 0, 5, 5, 11]))
    got = pipeline.gather(outer, [4, 0, 2])
    expected_rows = np.array([3 + 11, 3 + 26, 3 + 5])
    np.testing.assert_array_equal(got["image"], arrays.images[expected_rows])
    np.testing.assert_array_equal(got["label"], arrays.labels[expected_rows])
    slow = pipeline.gather(_Records(outer), [4, 0, 2])
    np.testing.assert_array_equal(slow["image"], got["image"])


@pytest.mark.parametrize("n, count", [(37, 1), (37, 2), (8, 4)])
def test_uint8_eval_batches_equal_the_float_path_after_device_conversion(n, count):
    arrays = _random_source(n=n)
    for i in range(count):
        kw = {"batch_size": 16, "process_index": i, "process_count": count}
        old = list(pipeline.eval_batches(_Records(arrays), **kw))
        new = list(pipeline.eval_batches(arrays, to_float=False, **kw))
        assert len(old) == len(new) == -(-n // 16)
        for a, b in zip(old, new, strict=True):
            assert b["image"].dtype == np.uint8
            np.testing.assert_array_equal(a["mask"], b["mask"])
            np.testing.assert_array_equal(a["label"], b["label"])
            np.testing.assert_array_equal(
                np.asarray(augment.to_float(b["image"])), a["image"]
            )
