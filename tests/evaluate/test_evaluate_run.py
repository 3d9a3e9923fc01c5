"""``calib_jax.evaluate``: a run's checkpoint or logits scored without retraining.

The end-to-end test trains a CIFAR-10 CNN for a few steps on mock TFDS data
with a tiny fake CIFAR-10-C ``.npy`` directory and SVHN (mocked) as the OOD
set, then evaluates the run's checkpoint and its exported logits: both give
the trainer's end-of-run metrics bit for bit, and the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from calib_jax import evaluate
from calib_jax.train import loop, metrics_log
from configs import cifar10_resnet110

CORRUPTIONS = ("contrast", "gaussian_noise", "glass_blur")


def write_cifar10_c(root, corruptions=CORRUPTIONS, n=8):
    """A tiny published-layout CIFAR-10-C directory: 5 severities x ``n`` images."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in corruptions:
        images = rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
        np.save(root / f"{name}.npy", images)
    np.save(root / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8))


def small_config(data_dir, c10c):
    config = cifar10_resnet110.get_config()
    config.model.name = "cnn"  # compiles in seconds on CPU
    config.dataset.data_dir = str(data_dir)
    config.num_steps = 3
    config.batch_size = 16
    config.eval_batch_size = 16
    config.log_every = 1
    config.checkpoint_every = 2
    config.shifts.dataset = "cifar10_corrupted"
    config.shifts.data_dir = str(c10c)
    config.shifts.corruptions = "all"
    config.ood.dataset = "svhn_cropped"
    return config


def _final_row(workdir):
    rows = metrics_log.load_jsonl(workdir / "metrics.jsonl")
    return {k: v for k, v in rows[-1].items() if k not in ("step", "time")}


def _npz(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
def test_evaluate_reproduces_the_trainers_end_of_run_metrics_and_logits(tmp_path):
    c10c = tmp_path / "CIFAR-10-C"
    write_cifar10_c(c10c)
    config = small_config(tmp_path / "data", c10c)
    run = tmp_path / "run"
    with tfds.testing.mock_data(
        num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        loop.train_and_evaluate(config, run, progress=False)
        trained = _final_row(run)
        got, out = evaluate.run(config, run, progress=False)
    out = Path(str(out))
    # 3 corruptions x 5 severities, their mean, val, test and the OOD set.
    shift_sets = {k.rsplit("/", 1)[0] for k in trained if k.startswith("shift/")}
    assert len(shift_sets) == 3 * 5 + 1
    assert {"ood/auroc", "ood/aupr_in", "ood/fpr_at_95_tpr"} <= set(trained)
    # Same keys in the same order, bit-equal floats.
    assert list(got) == list(trained)
    assert all(got[k] == trained[k] for k in trained)
    assert _final_row(out) == trained
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["metrics"] == trained and saved["source"] == "checkpoint"
    assert saved["step"] == 3
    # The logits files: the trainer's names, identical arrays.
    names = sorted(p.relative_to(run / "logits") for p in run.glob("logits/**/*.npz"))
    assert names == sorted(
        p.relative_to(out / "logits") for p in out.glob("logits/**/*.npz")
    )
    assert len(names) == 2 + 15 + 1
    for name in names:
        a, b = _npz(run / "logits" / name), _npz(out / "logits" / name)
        assert a.keys() == b.keys() == {"logits", "labels"}
        for key in a:
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key], b[key])
    ood = _npz(run / "logits" / "ood" / "svhn_cropped.npz")
    assert ood["logits"].shape == (24, 10) and np.all(ood["labels"] == -1)
    for plot in ("reliability_val.png", "reliability_test.png", "ece_vs_severity.png"):
        assert (out / "plots" / plot).read_bytes()[:4] == b"\x89PNG"

    # The exported logits alone (no checkpoint, no data) give the same numbers.
    from_logits, _ = evaluate.run(
        config, run, out=tmp_path / "from_logits", from_logits=True, progress=False
    )
    assert list(from_logits) == list(trained)
    assert all(from_logits[k] == trained[k] for k in trained)

    # Never over an earlier evaluation without overwrite.
    with pytest.raises(ValueError, match="already holds an evaluation"):
        evaluate.run(config, run, from_logits=True, progress=False)


# ---- fast checks on a run that holds only exported logits --------------------------


def _logits_only_run(root, keys, k=10, n=40):
    """A workdir with exported logits (random) and nothing else."""
    rng = np.random.default_rng(1)
    (root / "logits").mkdir(parents=True)
    out = {}
    for key in keys:
        z = rng.normal(size=(n, k)).astype(np.float32)
        y = rng.integers(0, k, n).astype(np.int32)
        np.savez(root / "logits" / (key.replace("/", "_") + ".npz"), logits=z, labels=y)
        out[key] = (z, y)
    return out


def _digits_config(corruptions="contrast,gaussian_noise", severities=(3, 1)):
    from configs import digits_ce

    config = digits_ce.get_config()
    config.shifts.corruptions = corruptions
    config.shifts.severities = severities
    return config


@pytest.mark.long
def test_from_logits_scores_the_sets_the_config_selects_in_its_order(tmp_path):
    from calib_jax import metrics

    keys = ["val", "test"] + [
        f"shift/{c}/{s}" for c in ("gaussian_noise", "contrast") for s in (1, 3)
    ]
    arrays = _logits_only_run(tmp_path / "run", keys)
    got, out = evaluate.run(
        _digits_config(), tmp_path / "run", from_logits=True, progress=False
    )
    order = ["contrast/3", "contrast/1", "gaussian_noise/3", "gaussian_noise/1"]
    shift_keys = [k for k in got if k.endswith("/nll") and k.startswith("shift/")]
    assert shift_keys == [f"shift/{s}/nll" for s in order] + ["shift/mean/nll"]
    z, y = arrays["test"]
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    assert got["test/ece"] == pytest.approx(float(metrics.ece(probs, y)), abs=1e-6)
    per_set = [got[f"shift/{s}/ece"] for s in order]
    assert got["shift/mean/ece"] == float(np.mean(per_set))
    saved = json.loads((Path(str(out)) / "metrics.json").read_text())
    assert saved["source"] == "logits" and saved["step"] is None
    assert not (Path(str(out)) / "logits").exists()  # the run's own are not copied
    # A set the config asks for that the run did not export: named.
    with pytest.raises(ValueError, match="shift_pixelate_3.npz is missing"):
        evaluate.run(
            _digits_config("pixelate", (3,)),
            tmp_path / "run",
            out=tmp_path / "o2",
            from_logits=True,
            progress=False,
        )


@pytest.mark.parametrize(
    "files, kwargs, message",
    [
        ((), {}, "holds neither checkpoints nor exported logits"),
        (("logits/test.npz",), {}, "holds no checkpoint; score its exported logits"),
        (("metrics.jsonl",), {"from_logits": True}, "holds neither checkpoints"),
    ],
)
def test_workdir_without_what_is_asked_for_is_one_line(
    tmp_path, files, kwargs, message
):
    run = tmp_path / "run"
    run.mkdir()
    for name in files:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        np.savez(run / name, logits=np.zeros((2, 3)), labels=np.zeros(2, int))
    with pytest.raises(ValueError) as err:
        evaluate.run(_digits_config(), run, progress=False, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (run / "evaluate").exists()


@pytest.mark.long
def test_out_may_not_be_the_run_itself_and_config_must_be_the_runs(tmp_path):
    run = tmp_path / "run"
    _logits_only_run(run, ["val", "test"])
    config = _digits_config("none")
    for out in (run, run / "logits", run / "checkpoints" / "x"):
        with pytest.raises(ValueError, match="the run's own directory"):
            evaluate.run(config, run, out=out, from_logits=True, overwrite=True)
    (run / "config.json").write_text(json.dumps(config.to_dict()))
    other = _digits_config("none")
    other.model.name = "cnn"
    with pytest.raises(ValueError, match="differs from the run's .* in: model;"):
        evaluate.run(other, run, from_logits=True, progress=False)
    first, _ = evaluate.run(config, run, from_logits=True, progress=False)
    again, _ = evaluate.run(
        config, run, from_logits=True, overwrite=True, progress=False
    )
    assert first == again and list(first) == [
        f"{s}/{m}"
        for s in ("val", "test")
        for m in ("accuracy", "nll", "ece", "adaptive_ece", "classwise_ece", "brier")
    ]


def test_progress_writes_one_line_per_interval_off_a_terminal(progress_shown):
    import io

    from calib_jax.evaluate._progress import Progress

    stream = io.StringIO()  # not a TTY
    with Progress(100, stream=stream, interval=0.0) as bar:
        bar("test", 40)
        bar("shift/contrast/1", 60)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # two updates and the final line
    assert lines[0].startswith("evaluate: 40/100 images (40%), test, ")
    assert "img/s, ETA" in lines[0] and "\r" not in stream.getvalue()
    assert lines[-1].startswith("evaluate: 100/100 images (100%), shift/contrast/1")


def test_tensorboard_events_equal_the_jsonl_row_with_a_diagram_per_split(tmp_path):
    from _events import read_events

    keys = ["val", "test"] + [f"shift/contrast/{s}" for s in (1, 3)]
    _logits_only_run(tmp_path / "run", keys)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 7, "loss/total": 1}\n')
    config = _digits_config("contrast", (1, 3))
    config.log.tensorboard = True
    got, out = evaluate.run(config, tmp_path / "run", from_logits=True, progress=False)
    row = json.loads((Path(str(out)) / "metrics.jsonl").read_text())
    scalars, images = read_events(str(Path(str(out)) / "tensorboard"))
    assert row["step"] == 7 and "shift/contrast/3/ece" in got
    assert scalars == {
        (k, 7): np.float32(v) for k, v in row.items() if k not in ("step", "time")
    }
    assert sorted(images) == [("test/reliability", 7), ("val/reliability", 7)]
    # The events are part of the evaluation: refused without --overwrite.
    (Path(str(out)) / "metrics.json").unlink()
    (Path(str(out)) / "metrics.jsonl").unlink()
    with pytest.raises(
        ValueError, match=r"already holds an evaluation \(.*tensorboard"
    ):
        evaluate.run(config, tmp_path / "run", from_logits=True, progress=False)


def test_unwritable_tensorboard_dir_fails_before_evaluating(tmp_path):
    _logits_only_run(tmp_path / "run", ["val", "test"])
    (tmp_path / "f").write_text("")
    config = _digits_config("none")
    config.log.tensorboard = True
    config.log.tensorboard_dir = str(tmp_path / "f")
    with pytest.raises(ValueError) as err:
        evaluate.run(config, tmp_path / "run", from_logits=True, progress=False)
    text = str(err.value)
    assert "\n" not in text
    assert f"TensorBoard log directory {tmp_path / 'f' / 'evaluate'} is not" in text
    assert not (tmp_path / "run" / "evaluate" / "metrics.jsonl").exists()
