"""MC dropout in the trainer and in ``python -m calib_jax.evaluate``.

A tiny digits run (``model.dropout_rate=0.2``, ``mc_dropout.num_samples=4``)
exports logits whose softmax is the mean of the samples' softmax and an
``mutual_information`` field, both checked against float64 NumPy on samples
drawn from the run's checkpoint with the documented keys; the evaluate CLI
reproduces them from the checkpoint (another eval batch size: the same
samples per row) and from the exported logits (bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from calib_jax import data as data_lib
from calib_jax import evaluate, models
from calib_jax.train import checkpoint, loop, metrics_log, setup, sharded_step
from calib_jax.train import evaluate as eval_lib
from calib_jax.train import mesh as mesh_lib
from calib_jax.train.state import variables
from configs import digits_ce

SAMPLES, SEED = 4, 3


def _config(**mc):
    config = digits_ce.get_config()
    config.num_steps = 3
    config.batch_size = 32
    config.eval_batch_size = 128  # 360 test rows: 3 batches, the last padded
    config.log_every = 1
    config.checkpoint_every = 3
    config.shifts.corruptions = "contrast"
    config.shifts.severities = (3,)
    config.ood.dataset = "digits_patches"
    config.model.dropout_rate = 0.2
    config.mc_dropout.num_samples = mc.get("num_samples", SAMPLES)
    config.mc_dropout.seed = mc.get("seed", SEED)
    return config


def _npz(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _softmax64(z):
    z = np.asarray(z, np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _entropy64(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)


def _final_row(workdir):
    rows = metrics_log.load_jsonl(Path(workdir) / "metrics.jsonl")
    return {k: v for k, v in rows[-1].items() if k not in ("step", "time")}


@pytest.mark.long
def test_mc_dropout_run_exports_mean_probabilities_and_mutual_information(tmp_path):
    config = _config()
    run = tmp_path / "run"
    loop.train_and_evaluate(config, run, progress=False)
    trained = _final_row(run)

    test = _npz(run / "logits" / "test.npz")
    assert set(test) == {"logits", "labels", "mutual_information"}
    assert test["logits"].dtype == np.float32 and test["logits"].shape == (360, 10)
    assert test["mutual_information"].dtype == np.float32
    assert test["mutual_information"].shape == (360,)
    for name in ("val.npz", "shift_contrast_3.npz", "ood/digits_patches.npz"):
        assert "mutual_information" in _npz(run / "logits" / name)
    digits = data_lib.load_digits("test")
    np.testing.assert_array_equal(test["labels"], digits["label"])

    # The samples, drawn from the checkpoint with the documented keys.
    dataset = data_lib.get_dataset("digits")
    model = sharded_step.make_model(config, dataset.num_classes)
    steps = sharded_step.build_sharded_step(
        config, dataset, mesh_lib.data_mesh(), 1, model=model
    )
    state, _ = checkpoint.restore_read_only(run, steps.abstract_state)
    key = jax.random.fold_in(jax.random.key(SEED), eval_lib.mc_set_tag("test"))
    samples = models.mc_dropout_logits(
        model,
        variables(state),
        sharded_step.preprocess(dataset, digits["image"]),
        key=key,
        num_samples=SAMPLES,
    )
    p = _softmax64(samples)  # [S, N, K]
    mean = p.mean(0)
    np.testing.assert_allclose(_softmax64(test["logits"]), mean, rtol=1e-5, atol=1e-6)
    mi = _entropy64(mean) - _entropy64(p).mean(0)
    np.testing.assert_allclose(test["mutual_information"], mi, rtol=1e-4, atol=1e-5)
    assert np.all(test["mutual_information"] >= 0) and mi.max() > 1e-3
    # The reported metrics are of the MC prediction.
    assert trained["test/mutual_information"] == float(
        np.mean(test["mutual_information"], dtype=np.float64)
    )
    nll = -np.mean(np.log(mean[np.arange(360), digits["label"]]))
    assert trained["test/nll"] == pytest.approx(nll, rel=1e-5)

    # python -m calib_jax.evaluate from the checkpoint, another batch size:
    # the same samples per row.
    config.eval_batch_size = 96
    got, out = evaluate.run(config, run, out=tmp_path / "ev", progress=False)
    assert list(got) == list(trained)
    for k in trained:
        assert got[k] == pytest.approx(trained[k], rel=1e-4, abs=1e-5), k
    again = _npz(Path(str(out)) / "logits" / "test.npz")
    np.testing.assert_allclose(again["logits"], test["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        again["mutual_information"], test["mutual_information"], atol=1e-5
    )
    # From the exported logits: the trainer's numbers bit for bit.
    got, _ = evaluate.run(
        config, run, out=tmp_path / "ev_logits", from_logits=True, progress=False
    )
    assert got == trained
    # --mc_dropout_samples=0: the deterministic model, no mutual information.
    got, out = evaluate.run(
        config, run, out=tmp_path / "ev0", progress=False, mc_dropout_samples=0
    )
    assert "test/mutual_information" not in got
    plain = _npz(Path(str(out)) / "logits" / "test.npz")
    assert set(plain) == {"logits", "labels"}
    assert not np.allclose(plain["logits"], test["logits"], atol=1e-3)
    # --mc_dropout_seed: other samples.
    got, _ = evaluate.run(
        config, run, out=tmp_path / "ev_seed", progress=False, mc_dropout_seed=SEED + 1
    )
    assert got["test/nll"] != trained["test/nll"]


def test_mc_dropout_without_dropout_is_one_line_before_any_work(tmp_path):
    config = _config()
    config.model.dropout_rate = 0.0
    with pytest.raises(ValueError) as err:
        setup.build(config, tmp_path / "w")
    text = str(err.value)
    assert "\n" not in text
    assert (
        "config.mc_dropout.num_samples=4 needs a model with dropout, but model "
        "'mlp' has none (config.model.dropout_rate=0.0); set "
        "config.model.dropout_rate > 0 (models with dropout: mlp, cnn, wrn28_10, "
        "wrn26_10) or config.mc_dropout.num_samples=0." == text
    )
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"mc_dropout_samples": 4, "from_logits": True},
            "--mc_dropout_samples=4 needs the checkpoint: --from_logits scores",
        ),
        ({"mc_dropout_samples": -2}, "--mc_dropout_samples must be an int >= 0"),
        ({"mc_dropout_seed": -1}, "--mc_dropout_seed must be an int >= 0"),
    ],
)
def test_evaluate_mc_dropout_flag_errors_are_one_line(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as err:
        evaluate.run(_config(), tmp_path, progress=False, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_run_recorded_before_dropout_rate_existed_is_checked_as_rate_zero(tmp_path):
    import json

    from calib_jax.evaluate import _run

    config = digits_ce.get_config()
    old = json.loads(config.to_json_best_effort())
    del old["model"]["dropout_rate"], old["mc_dropout"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    _run.check_config(config, tmp_path)  # no difference
    config.model.dropout_rate = 0.2
    with pytest.raises(ValueError, match="differs from the run's .* in: model;"):
        _run.check_config(config, tmp_path)
