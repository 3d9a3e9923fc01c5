"""The trainer's input path: prefetch changes nothing, uint8 on device, wait fraction."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import data
from calib_jax.data import pipeline
from calib_jax.train import loop, metrics_log
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import setup as setup_lib
from calib_jax.train.checkpoint import Checkpointer
from configs import cifar10_resnet110, digits_ce


def _rows(workdir):
    return metrics_log.load_jsonl(workdir / "metrics.jsonl")


def _final_params(config, workdir):
    run = setup_lib.build(config, workdir)
    ckpt = Checkpointer(workdir)
    state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    return jax.device_get(state.params), int(state.step)


def _assert_same_run(a, b, config):
    """Same logged values (but time and wait), exported logits and parameters."""
    drop = ("time", "train/input_wait_fraction")
    last = {}
    for workdir in (a, b):  # a resumed run logs some steps twice: keep the last
        last[workdir] = {
            (r["step"], tuple(sorted(k for k in r if k not in drop))): {
                k: v for k, v in r.items() if k not in drop
            }
            for r in _rows(workdir)
        }
    assert last[a] == last[b]
    with (
        np.load(a / "logits" / "test.npz") as x,
        np.load(b / "logits" / "test.npz") as y,
    ):
        np.testing.assert_array_equal(x["logits"], y["logits"])
    pa, sa = _final_params(config, a)
    pb, sb = _final_params(config, b)
    assert sa == sb == config.num_steps
    jax.tree.map(np.testing.assert_array_equal, pa, pb)


def _digits(prefetch, shifts="contrast"):
    c = digits_ce.get_config()
    c.num_steps, c.log_every, c.checkpoint_every = 12, 4, 4
    c.batch_size, c.eval_batch_size = 64, 128
    c.shifts.corruptions, c.shifts.severities = shifts, (3,)
    c.input.prefetch = prefetch
    return c


@pytest.mark.long
def test_digits_with_prefetch_equals_without_and_logs_the_input_wait(tmp_path):
    assert len(jax.devices()) == 8
    loop.train_and_evaluate(_digits(0), tmp_path / "sync", progress=False)
    loop.train_and_evaluate(_digits(2), tmp_path / "ahead", progress=False)
    _assert_same_run(tmp_path / "sync", tmp_path / "ahead", _digits(0))
    for workdir in ("sync", "ahead"):
        logged = [r for r in _rows(tmp_path / workdir) if "loss/total" in r]
        assert [r["step"] for r in logged] == [4, 8, 12]
        for r in logged:
            assert 0.0 <= r["train/input_wait_fraction"] <= 1.0


@pytest.mark.long
def test_resuming_with_another_prefetch_depth_gives_the_same_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    loop.train_and_evaluate(_digits(0, shifts="none"), straight, progress=False)
    loop.train_and_evaluate(_digits(3, shifts="none"), resumed, progress=False)
    # Drop the last checkpoint and outputs: resume at step 8 with prefetch 1.
    shutil.rmtree(resumed / "checkpoints" / "12")
    shutil.rmtree(resumed / "logits")
    loop.train_and_evaluate(_digits(1, shifts="none"), resumed, progress=False)
    config = json.loads((resumed / "config.json").read_text())
    assert config["input"]["prefetch"] == 3  # the first run's config is kept
    # The first run's records after step 8 were dropped on resume: each step once.
    lines = (resumed / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows if "loss/total" in r] == [4, 8, 12]
    assert [r["step"] for r in rows if "test/ece" in r] == [12]
    _assert_same_run(straight, resumed, _digits(0, shifts="none"))


def _cifar(data_dir, prefetch):
    c = cifar10_resnet110.get_config()
    c.model.name = "mlp"  # compiles in a second; the input path is the same
    c.dataset.data_dir = str(data_dir)
    c.num_steps, c.batch_size, c.eval_batch_size = 4, 16, 16
    c.log_every, c.checkpoint_every, c.eval_every = 2, 2, 0
    c.shifts.corruptions, c.shifts.severities = "gaussian_noise", (2,)
    c.input.prefetch = prefetch
    return c


def _mock():
    return tfds.testing.mock_data(
        num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE
    )


@pytest.mark.slow  # two CIFAR trainings with evaluation and a corruption
def test_cifar_with_prefetch_equals_without(tmp_path):
    with _mock():
        for prefetch, name in ((0, "sync"), (2, "ahead")):
            config = _cifar(tmp_path / "data", prefetch)
            loop.train_and_evaluate(config, tmp_path / name, progress=False)
        _assert_same_run(tmp_path / "sync", tmp_path / "ahead", config)


@pytest.mark.long
def test_cifar_uint8_batches_train_exactly_like_host_float_batches(tmp_path):
    config = _cifar(tmp_path / "data", 0)
    with _mock():
        run = setup_lib.build(config, tmp_path / "w")
        records = data.get_dataset("cifar10", data_dir=config.dataset.data_dir).source(
            "train"
        )
        rows = mesh_lib.batch_sharding(mesh_lib.data_mesh())
        old_state, new_state = run.init_state(), run.init_state()
        for step in range(2):
            placed = run.batch(step)
            assert placed[1]["image"].dtype == np.uint8
            old = pipeline.train_batch(  # today's path: per record, float on host
                records, step=step, batch_size=config.batch_size, seed=config.seed
            )
            assert old["image"].dtype == np.float32
            old["mask"] = np.ones(len(old["label"]), bool)
            old_state, old_metrics = run.train(
                old_state, (False, mesh_lib.put_batch(old, rows))
            )
            new_state, new_metrics = run.train(new_state, placed)
            jax.tree.map(
                np.testing.assert_array_equal,
                jax.device_get(old_metrics),
                jax.device_get(new_metrics),
            )
        jax.tree.map(
            np.testing.assert_array_equal,
            jax.device_get(old_state.params),
            jax.device_get(new_state.params),
        )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("prefetch", -1, "config.input.prefetch must be >= 0, got -1."),
        ("memory_gb", -0.5, "config.input.memory_gb must be >= 0, got -0.5."),
        ("memory_gb", float("nan"), "config.input.memory_gb must be >= 0, got nan."),
        ("decode_workers", -2, "config.input.decode_workers must be >= 0, got -2."),
    ],
)
def test_bad_input_settings_are_one_line_errors(tmp_path, field, value, message):
    config = _digits(2)
    config.input[field] = value
    with pytest.raises(ValueError) as err:
        setup_lib.build(config, tmp_path / "w")
    assert str(err.value) == message
    assert not (tmp_path / "w").exists()
