"""calib_jax.data.schedule: the step -> batch map, plain and interleaved."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calib_jax.data import ArraySource, pipeline, schedule

N, BATCH = 103, 8


def _source(n=N):
    # The label of each example is its index: batches say which examples they read.
    images = np.arange(n, dtype=np.uint8).reshape(n, 1, 1, 1)
    return ArraySource(images, np.arange(n))


def test_plain_schedule_is_the_pipelines_batches():
    source = _source()
    s = schedule.train_schedule(source, batch_size=BATCH, seed=3)
    assert s.steps_per_epoch == math.ceil(N / BATCH) and s.held is None
    for step in (0, 1, 12, 13, 40):
        secondary, batch = s(step)
        want = pipeline.train_batch(
            source, step=step, batch_size=BATCH, seed=3, to_float=False
        )
        assert secondary is False
        np.testing.assert_array_equal(batch["label"], want["label"])
        np.testing.assert_array_equal(batch["image"], want["image"])
        assert batch["image"].dtype == np.uint8  # as stored


def test_interleaved_epoch_reads_the_majority_then_the_held_out_part():
    s = schedule.train_schedule(
        _source(), batch_size=BATCH, seed=0, holdout_fraction=0.2
    )
    n_hold = round(0.2 * N)
    held = set(np.asarray(s.held.indices).tolist())
    major = set(np.asarray(s.primary.indices).tolist())
    assert len(held) == n_hold and len(major) == N - n_hold
    assert held | major == set(range(N)) and not held & major
    major_steps, held_steps = math.ceil((N - n_hold) / BATCH), math.ceil(n_hold / BATCH)
    assert s.steps_per_epoch == major_steps + held_steps
    for epoch in range(2):
        seen_held = set()
        for pos in range(s.steps_per_epoch):
            secondary, batch = s(epoch * s.steps_per_epoch + pos)
            labels = set(batch["label"].tolist())
            assert secondary == (pos >= major_steps)
            assert labels <= (held if secondary else major)
            if secondary:
                seen_held |= labels
        if epoch == 0:
            assert seen_held == held  # one pass over the held-out part
    # The held-out step k of epoch e is step e * held_steps + k of its stream.
    _, batch = s(s.steps_per_epoch + major_steps + 1)
    want = pipeline.train_batch(
        s.held, step=held_steps + 1, batch_size=BATCH, seed=0, to_float=False
    )
    np.testing.assert_array_equal(batch["label"], want["label"])


def test_split_is_fixed_and_the_seed_orders_within_it():
    a = schedule.train_schedule(
        _source(), batch_size=BATCH, seed=0, holdout_fraction=0.2
    )
    b = schedule.train_schedule(
        _source(), batch_size=BATCH, seed=1, holdout_fraction=0.2
    )
    np.testing.assert_array_equal(a.held.indices, b.held.indices)
    order = np.random.default_rng(schedule.HOLDOUT_SEED).permutation(N)
    np.testing.assert_array_equal(a.held.indices, np.sort(order[: round(0.2 * N)]))
    assert not np.array_equal(a(0)[1]["label"], b(0)[1]["label"])


def test_process_slices_concatenate_to_the_global_batch():
    kw = dict(batch_size=BATCH, seed=0, holdout_fraction=0.2)
    whole = schedule.train_schedule(_source(), **kw)
    parts = [
        schedule.train_schedule(_source(), process_index=i, process_count=2, **kw)
        for i in range(2)
    ]
    for step in (0, whole.steps_per_epoch - 1):
        got = np.concatenate([p(step)[1]["label"] for p in parts])
        np.testing.assert_array_equal(got, whole(step)[1]["label"])


@pytest.mark.parametrize("fraction", [1e-9, 0.9999])
def test_holdout_leaving_one_side_empty_is_one_line(fraction):
    with pytest.raises(
        ValueError,
        match=r"config.interleaved.holdout_fraction leaves no example on one side "
        r"of the 103 training examples",
    ):
        schedule.train_schedule(
            _source(), batch_size=BATCH, seed=0, holdout_fraction=fraction
        )
