"""Bad input at every host-facing entry point: one line naming the problem.

Library calls raise ``ValueError`` (``TypeError`` for a wrong dtype, the house
rule); command lines exit non-zero with one line on stderr and no traceback.
Cases already covered elsewhere are not repeated here:
tests/losses/test_registry.py (names, hyperparameters, shapes),
tests/metrics/test_metrics_validation.py (NaN, simplex, labels, bins),
tests/posthoc/test_posthoc_registry_cli.py (fit and CLI on bad arrays, keys),
tests/train/test_cli.py (config typos, unknown names, batch divisibility),
tests/train/test_multihost.py (distributed settings),
tests/evaluate/test_evaluate_run.py (evaluate: what a workdir lacks, --out).
tests/test_sharding.py (sharding.shard_classes: every shape against the mesh).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from calib_jax import losses, metrics, posthoc, sharding
from calib_jax.posthoc import _cli as posthoc_cli
from calib_jax.train import setup
from configs import digits_ce

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(16, 4)).astype(np.float32)
LABELS = RNG.integers(0, 4, 16).astype(np.int32)


def _one_line(err: BaseException | str) -> str:
    text = str(err).strip()
    assert text and "\n" not in text, text
    return text


# ---------------------------------------------------------------------------
# Losses: eager (host) calls check values; jitted calls do not.
# ---------------------------------------------------------------------------


def _with(row: int, value) -> np.ndarray:
    out = LOGITS.copy()
    out[row, 1] = value
    return out


LOSS_CASES = {
    "nan": (
        lambda: (_with(3, np.nan), LABELS),
        "NaN or inf in 1 row(s) (first: row 3)",
    ),
    "inf": (
        lambda: (_with(5, np.inf), LABELS),
        "NaN or inf in 1 row(s) (first: row 5)",
    ),
    "label_high": (
        lambda: (LOGITS, np.where(np.arange(16) == 2, 4, LABELS).astype(np.int32)),
        "labels must lie in [0, K) = [0, 4); found 4 at row 2",
    ),
    "label_negative": (
        lambda: (LOGITS, np.where(np.arange(16) == 0, -1, LABELS).astype(np.int32)),
        "found -1 at row 0",
    ),
    "k1": (lambda: (LOGITS[:, :1], LABELS * 0), "at least 2 classes"),
}


@pytest.mark.parametrize("case", sorted(LOSS_CASES))
@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_every_loss_rejects_bad_values_eagerly(name, case):
    make, message = LOSS_CASES[case]
    logits, labels = make()
    with pytest.raises(ValueError) as err:
        losses.get_loss(name)(logits, labels)
    assert message in _one_line(err.value)


@pytest.mark.parametrize("case", ["nan", "label_high", "k1"])
def test_composite_rejects_bad_values(case):
    make, message = LOSS_CASES[case]
    objective = losses.composite([dict(name="cross_entropy"), dict(name="sb_ece")])
    with pytest.raises(ValueError) as err:
        objective(*make())
    assert message in _one_line(err.value)


def test_loss_value_checks_ignore_masked_rows_and_traced_inputs():
    logits = _with(3, np.nan)
    labels = np.where(np.arange(16) == 3, 99, LABELS).astype(np.int32)
    where = np.arange(16) != 3
    got = losses.focal(logits, labels, where=where, gamma=2.0)
    want = losses.focal(LOGITS[where], LABELS[where], gamma=2.0)
    np.testing.assert_allclose(np.asarray(got)[where], want, rtol=1e-6)
    # Under jit nothing is inspected: NaN logits give a NaN, not an error.
    out = jax.jit(lambda z, y: losses.cross_entropy(z, y))(logits, LABELS)
    assert np.isnan(np.asarray(out)[3])


@pytest.mark.parametrize("name", sorted(losses.BATCH_LEVEL))
def test_batch_level_losses_of_an_empty_batch_are_zero(name):
    out = losses.get_loss(name)(LOGITS[:0], LABELS[:0])
    assert out.shape == () and float(out) == 0.0


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", sorted(set(metrics.METRICS) - {"ood_auroc", "fpr_at_95_tpr"})
)
def test_every_metric_rejects_a_single_class(name):
    options = {"risk_at_coverage": {"coverage": 0.5}, "coverage_at_risk": {"risk": 0.1}}
    with pytest.raises(ValueError) as err:
        metrics.get_metric(name)(
            np.ones((8, 1), np.float32), np.zeros(8, np.int32), **options.get(name, {})
        )
    assert "K = 1" in _one_line(err.value)


def test_binned_stats_reject_non_binary_outcomes():
    conf = np.linspace(0.3, 0.9, 8).astype(np.float32)
    with pytest.raises(ValueError) as err:
        metrics.BinnedStats.from_confidences(conf, np.full(8, 0.5, np.float32))
    assert "correct must be bool or 0/1" in _one_line(err.value)
    ok = metrics.BinnedStats.from_confidences(conf, np.ones(8, np.float32))
    assert float(ok.compute()) == pytest.approx(1.0 - conf.mean(), rel=1e-5)


# ---------------------------------------------------------------------------
# Post-hoc: fit options and the CLI's input files (CLI main in-process).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, option, value, message",
    [
        ("ts", "tol", -1.0, "option tol must be >= 0"),
        ("pts", "learning_rate", 0.0, "option learning_rate must be > 0"),
        ("pts", "learning_rate", float("nan"), "option learning_rate must be > 0"),
        ("pts", "weight_decay", -0.1, "option weight_decay must be >= 0"),
        ("ts+classwise", "weight_tol", -1.0, "option weight_tol must be >= 0"),
    ],
)
def test_fit_rejects_options_outside_their_domain(name, option, value, message):
    logits = (3.0 * LOGITS).repeat(4, axis=0)
    with pytest.raises(ValueError) as err:
        posthoc.fit(name, logits, np.tile(LABELS, 4), **{option: value})
    assert message in _one_line(err.value)


@pytest.fixture(scope="module")
def npz_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("npz")
    np.savez(d / "test.npz", logits=LOGITS, labels=LABELS)
    (d / "garbage.npz").write_bytes(b"definitely not a zip archive")
    (d / "truncated.npz").write_bytes((d / "test.npz").read_bytes()[:200])
    np.save(d / "array.npy", LOGITS)
    (d / "folder.npz").mkdir()
    np.savez(d / "strings.npz", logits=np.array(["a", "b"]), labels=LABELS[:2])
    np.savez(d / "fractional.npz", logits=LOGITS, labels=LABELS + 0.5)
    np.savez(d / "objects.npz", logits=np.array([LOGITS, None], object), labels=LABELS)
    return d


@pytest.mark.parametrize(
    "val, message",
    [
        ("garbage.npz", "is not an .npz archive"),
        ("truncated.npz", "is not an .npz archive"),
        # An .npy --val is a shard of the scores; its labels are a sibling file.
        ("array.npy", "array.npy' has no labels file: expected its labels [n] in"),
        ("folder.npz", "is not a file"),
        ("strings.npz", "array 'logits' must be floating point, got dtype <U1"),
        ("fractional.npz", "array 'labels' must be integer class ids"),
        ("objects.npz", "Object arrays cannot be loaded"),
    ],
)
def test_posthoc_cli_unreadable_files_are_one_line(npz_files, capsys, val, message):
    code = posthoc_cli.main(
        [
            "--val",
            str(npz_files / val),
            "--test",
            str(npz_files / "test.npz"),
            "--method",
            "ts",
            "--out",
            str(npz_files / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert message in _one_line(err) and "--val" in err
    assert not (npz_files / "out").exists()


# ---------------------------------------------------------------------------
# Training: config values (the library call behind the CLI), then the CLI.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"batch_size": 0}, "config.batch_size must be a positive int, got 0"),
        ({"batch_size": -8}, "config.batch_size must be a positive int"),
        ({"log_every": 0}, "config.log_every must be a positive int"),
        ({"checkpoint_every": 0}, "config.checkpoint_every must be a positive int"),
        (
            {"checkpoint_timeout_s": 0},
            "config.checkpoint_timeout_s must be a positive int",
        ),
        ({"seed": -1}, "config.seed must be >= 0"),
        ({"num_steps": 0, "num_epochs": 0.0}, "num_steps or config.num_epochs"),
        ({"optimizer.learning_rate": -1.0}, "learning_rate must be > 0"),
        ({"optimizer.weight_decay": -1.0}, "weight_decay must be >= 0"),
        ({"optimizer.momentum": 1.5}, "momentum must be in [0, 1)"),
        ({"optimizer.decay": "biases"}, "decay must be 'all' or 'kernels'"),
        ({"schedule.warmup_steps": -5}, "warmup_steps must be >= 0"),
        ({"schedule.boundaries": (0.9, 0.2)}, "boundaries must be increasing"),
        ({"model.kwargs": {"widht": 3}}, "config.model.kwargs: "),
        (
            {"model.dtype": "bfloat17"},
            "Unknown config.model.dtype 'bfloat17'. Valid dtypes: float32, bfloat16",
        ),
        (
            {"model.dtype": "bfloat16", "model.kwargs": {"dtype": "float16"}},
            "contradicts config.model.kwargs.dtype='float16'",
        ),
        ({"shifts.severities": (0, 6)}, "severities must be in 1..5"),
        ({"shifts.corruptions": "fog2"}, "Unknown corruption(s) fog2"),
        ({"augment": "flip"}, "Unknown config.augment 'flip'"),
        ({"loss": ({"name": "focal", "gamma": -1.0},)}, "focal.gamma must be >= 0"),
        ({"optimizer.name": "adam2"}, "Unknown optimizer 'adam2'"),
        ({"schedule.name": "linear"}, "Unknown schedule 'linear'"),
        ({"dataset.train_split": "trian"}, "Unknown split 'trian'"),
        (
            {"interleaved.enabled": True, "interleaved.holdout_fraction": 1.5},
            "holdout_fraction must be in (0, 1)",
        ),
    ],
)
def test_bad_config_values_are_one_line_value_errors(tmp_path, overrides, message):
    config = digits_ce.get_config()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    with pytest.raises(ValueError) as err:
        setup.build(config, tmp_path / "w")
    assert message in _one_line(err.value)
    assert not (tmp_path / "w").exists()  # nothing written, config.json included


def _assert_cli_errors_are_one_line(runs: dict) -> None:
    """Runs every ``name: (command, cwd, message)`` at once; each must exit
    with status 2, no traceback, and ``message`` in one stderr line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = str(ROOT)
    procs = {
        name: subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (cmd, cwd, _) in runs.items()
    }
    try:
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=900)
            assert proc.returncode == 2, (name, err[-2000:])
            assert "Traceback" not in err, name
            assert runs[name][2] in _one_line(err), (name, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


@pytest.mark.long
def test_train_cli_user_errors_are_one_line(tmp_path):
    """Three CLI paths not reachable in-process, run concurrently."""
    (tmp_path / "a_file").write_text("not a directory")

    def command(workdir, *extra):
        return [
            sys.executable,
            "-m",
            "calib_jax.train",
            f"--config={ROOT / 'configs' / 'digits_ce.py'}",
            f"--workdir={workdir}",
            "--config.num_steps=2",
            "--config.shifts.corruptions=none",
            *extra,
        ]

    runs = {
        "workdir is a file": (
            command(tmp_path / "a_file"),
            ROOT,
            "exists and is not a directory",
        ),
        "bad process id": (
            command(
                tmp_path / "w1",
                "--coordinator_address=127.0.0.1:1",
                "--num_processes=2",
                "--process_id=2",
            ),
            ROOT,
            "process_id must be < num_processes",
        ),
        # From another directory, a name that is neither a file nor a
        # shipped config lists the shipped ones.
        "unknown config": (
            [
                sys.executable,
                "-m",
                "calib_jax.train",
                "--config=no_such_config:quick",
                f"--workdir={tmp_path / 'w2'}",
                "--config.num_steps=2",
            ],
            tmp_path,
            (
                "unknown --config 'no_such_config': no such file and no shipped "
                "config of that name; shipped configs: benchmark_cifar10, "
                "benchmark_cifar100,"
            ),
        ),
    }
    _assert_cli_errors_are_one_line(runs)
    assert not (tmp_path / "w1").exists() and not (tmp_path / "w2").exists()


@pytest.mark.long
def test_evaluate_cli_user_errors_are_one_line(tmp_path):
    """``python -m calib_jax.evaluate``: a workdir that holds nothing to score,
    a missing workdir and an earlier evaluation, run concurrently."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    done = tmp_path / "done"
    (done / "logits").mkdir(parents=True)
    np.savez(done / "logits" / "test.npz", logits=LOGITS, labels=LABELS)
    (done / "evaluate").mkdir()
    (done / "evaluate" / "metrics.json").write_text("{}")

    def command(workdir, *extra):
        return [
            sys.executable,
            "-m",
            "calib_jax.evaluate",
            f"--config={ROOT / 'configs' / 'digits_ce.py'}",
            f"--workdir={workdir}",
            "--config.shifts.corruptions=none",
            *extra,
        ]

    runs = {
        "no checkpoints or logits": (
            command(empty),
            "holds neither checkpoints nor exported logits",
        ),
        "no workdir": (command(tmp_path / "nope"), "does not exist"),
        "earlier evaluation": (
            command(done, "--from_logits"),
            "already holds an evaluation (metrics.json); pass --overwrite",
        ),
    }
    _assert_cli_errors_are_one_line(
        {name: (cmd, ROOT, message) for name, (cmd, message) in runs.items()}
    )
    assert not (empty / "evaluate").exists()
    assert (done / "evaluate" / "metrics.json").read_text() == "{}"


# ---------------------------------------------------------------------------
# Storage paths: a malformed URL or a missing bucket is one line naming the
# path, before any training and without writing anything (tests/_gcs.py).
# ---------------------------------------------------------------------------

BAD_BUCKET_PATHS = [
    ("gs://", "it names no bucket"),
    ("gs:/bucket/run", "a URL needs two slashes, gs://<bucket>/<path>"),
    ("gs:bucket/run", "would be a local directory named 'gs:'"),
    ("gcs://bucket/run", "unsupported scheme gcs://"),
    ("gs://Bucket/run", "'Bucket' is not a GCS bucket name"),
    ("gs://no-such-bucket/run", "bucket gs://no-such-bucket does not exist"),
]


@pytest.mark.parametrize("workdir, message", BAD_BUCKET_PATHS)
def test_train_rejects_bad_bucket_paths_before_training(
    gcs_emulator, tmp_path, monkeypatch, workdir, message
):
    from calib_jax.train import loop

    monkeypatch.chdir(tmp_path)  # a malformed URL would become ./gs:/...
    buckets = gcs_emulator.buckets()
    config = digits_ce.get_config()
    config.num_steps = 2
    with pytest.raises(ValueError) as err:
        loop.train_and_evaluate(config, workdir, progress=False)
    text = _one_line(err.value)
    assert message in text and text.startswith("--workdir ")
    assert list(tmp_path.iterdir()) == []
    assert gcs_emulator.buckets() == buckets  # no bucket was created


def test_benchmark_and_datasets_reject_bad_bucket_paths(gcs_emulator, tmp_path):
    from calib_jax import data
    from calib_jax.benchmark import runner
    from configs import benchmark_digits

    with pytest.raises(ValueError) as err:
        runner.run(benchmark_digits.get_config(), "gs:/bucket/bench")
    assert "--workdir 'gs:/bucket/bench' is not a valid path" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        runner.run(benchmark_digits.get_config(), "gs://no-such-bucket/bench")
    assert "bucket gs://no-such-bucket does not exist" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        data.get_dataset("cifar100_corrupted", data_dir="gs:/bucket/CIFAR-100-C")
    assert "data_dir 'gs:/bucket/CIFAR-100-C' is not a valid path" in _one_line(
        err.value
    )
    with pytest.raises(ValueError) as err:
        data.get_dataset("cifar100_corrupted", data_dir="gs://no-such-bucket/c")
    assert _one_line(err.value).startswith("data_dir gs://no-such-bucket/c: bucket")


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--val", "gs:/bucket/val.npz", "a URL needs two slashes"),
        ("--val", "gs://no-such-bucket/val.npz", "does not exist"),
        ("--test", "gs://", "it names no bucket"),
        ("--out", "gs://no-such-bucket/out", "does not exist"),
        ("--out", "gcs://bucket/out", "unsupported scheme gcs://"),
    ],
)
def test_posthoc_cli_bad_bucket_paths_are_one_line(
    gcs_emulator, npz_files, capsys, flag, value, message
):
    args = {
        "--val": str(npz_files / "test.npz"),
        "--test": str(npz_files / "test.npz"),
        "--out": str(npz_files / "never"),
    }
    args[flag] = value
    argv = [x for pair in args.items() for x in pair] + ["--method", "ts"]
    code = posthoc_cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert message in _one_line(err) and flag in err and value in err
    assert not (npz_files / "never").exists()


def test_posthoc_cli_missing_object_in_a_bucket(gcs_bucket, npz_files, capsys):
    code = posthoc_cli.main(
        ["--val", f"{gcs_bucket}/nope.npz", "--test", str(npz_files / "test.npz")]
        + ["--out", str(npz_files / "never"), "--method", "ts"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"--val file '{gcs_bucket}/nope.npz' does not exist" in _one_line(err)


@pytest.mark.long
def test_train_cli_missing_bucket_is_one_line(gcs_emulator, tmp_path):
    """The command line (the library cases above run in-process): exit 2, one
    line on stderr, nothing written, no bucket created."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "calib_jax.train",
            f"--config={ROOT / 'configs' / 'digits_ce.py'}",
            "--workdir=gs://no-such-bucket/run",
            "--config.num_steps=2",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert _one_line(result.stderr).startswith(
        "error: --workdir gs://no-such-bucket/run: bucket gs://no-such-bucket "
        "does not exist"
    )
    assert list(cwd.iterdir()) == []
    assert "no-such-bucket" not in gcs_emulator.buckets()


# ---------------------------------------------------------------------------
# +inf and -inf (not only NaN): post-hoc fits, the post-hoc CLI, metrics.
# ---------------------------------------------------------------------------

INFINITIES = {"+inf": np.inf, "-inf": -np.inf}


@pytest.mark.long
@pytest.mark.parametrize("sign", sorted(INFINITIES))
@pytest.mark.parametrize("name", sorted(posthoc.CALIBRATORS))
def test_every_calibrator_rejects_infinite_logits(name, sign):
    binary = name in ("platt", "beta")
    logits = (LOGITS[:, :2] if binary else LOGITS).copy()
    labels = LABELS % 2 if binary else LABELS
    logits[5, 1] = INFINITIES[sign]
    with pytest.raises(ValueError) as err:
        posthoc.fit(name, logits, labels)
    assert "logits contains NaN or inf in 1 row(s) (first: row 5)" in _one_line(
        err.value
    )


@pytest.mark.long
@pytest.mark.parametrize("sign", sorted(INFINITIES))
@pytest.mark.parametrize("name", sorted(metrics.METRICS))
def test_every_metric_rejects_infinite_probabilities(name, sign):
    options = {"risk_at_coverage": {"coverage": 0.5}, "coverage_at_risk": {"risk": 0.1}}
    probs = np.asarray(jax.nn.softmax(LOGITS), np.float32).copy()
    probs[3, 1] = INFINITIES[sign]
    with pytest.raises(ValueError) as err:
        metrics.get_metric(name)(probs, LABELS, **options.get(name, {}))
    assert "probs contains NaN or inf in 1 row(s)" in _one_line(err.value)


@pytest.mark.parametrize("which", ["--val", "--test"])
@pytest.mark.parametrize("sign", sorted(INFINITIES))
def test_posthoc_cli_infinite_logits_are_one_line(tmp_path, capsys, sign, which):
    bad = LOGITS.copy()
    bad[7, 2] = INFINITIES[sign]
    np.savez(tmp_path / "good.npz", logits=LOGITS, labels=LABELS)
    np.savez(tmp_path / "bad.npz", logits=bad, labels=LABELS)
    files = {"--val": "good.npz", "--test": "good.npz", which: "bad.npz"}
    args = [a for flag, name in files.items() for a in (flag, str(tmp_path / name))]
    code = posthoc_cli.main([*args, "--method", "ts", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    line = _one_line(err)
    assert which in line and "NaN or inf in 1 row(s) (first: row 7)" in line
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# A rejected config leaves the workdir as it was (train and benchmark).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_epochs": 0.0}, "Set config.num_steps or config.num_epochs"),
        ({"num_epochs": float("nan")}, "num_epochs=nan"),
        (
            {"interleaved.enabled": True, "interleaved.holdout_fraction": 1e-9},
            "holdout_fraction leaves no example on one side",
        ),
    ],
)
def test_rejected_config_writes_nothing_and_keeps_an_existing_workdir(
    tmp_path, overrides, message
):
    config = digits_ce.get_config()
    config.num_steps = 2
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    if "num_epochs" in overrides:
        config.num_steps = 0
    with pytest.raises(ValueError) as err:
        setup.build(config, tmp_path / "new")
    assert message in _one_line(err.value)
    assert not (tmp_path / "new").exists()
    # An existing, empty workdir stays empty.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError):
        setup.build(config, tmp_path / "empty")
    assert not any((tmp_path / "empty").iterdir())


def test_benchmark_rejects_a_bad_train_config_before_writing(tmp_path):
    from calib_jax.benchmark import runner
    from configs import benchmark_digits

    config = benchmark_digits.get_config("quick")
    config.train.num_steps, config.train.num_epochs = 0, 0.0
    with pytest.raises(ValueError) as err:
        runner.validate(config, tmp_path / "w")
    assert "Set config.num_steps or config.num_epochs" in _one_line(err.value)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "method, field, value, message",
    [
        ("ce", "calibration_stats", "sometimes", "config.calibration_stats must be"),
        ("sb_ece", "augment", "flip", "Unknown config.augment 'flip'"),
        (
            "interleaved_sb_ece",
            "interleaved.holdout_fraction",
            1.5,
            "holdout_fraction must be in (0, 1), got 1.5",
        ),
    ],
)
def test_benchmark_checks_every_method_config_before_writing(
    tmp_path, method, field, value, message
):
    from calib_jax.benchmark import grid, runner
    from configs import benchmark_digits

    assert method in grid.METHODS
    config = benchmark_digits.get_config("quick")
    config.methods = tuple(dict.fromkeys(("ce", method)))
    *parents, leaf = f"train.{field}".split(".")
    node = config
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ValueError) as err:
        runner.validate(config, tmp_path / "w")
    assert message in _one_line(err.value)
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------
# Labels beyond int32, conformal coverage, saved calibrators, apply's K.
# ---------------------------------------------------------------------------


@pytest.mark.long
def test_labels_beyond_int32_coverage_labels_and_apply_k_are_one_line(tmp_path):
    from calib_jax import conformal

    wide = LABELS.astype(np.int64)
    wide[2] = 2**40
    with pytest.raises(ValueError) as err:
        posthoc.fit("ts", LOGITS, wide)
    assert f"[0, 4); found {2**40} at row 2" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        conformal.coverage(LOGITS > 0, np.where(np.arange(16) == 6, 15, LABELS))
    assert "labels must lie in [0, K) = [0, 4); found 15 at row 6" in _one_line(
        err.value
    )
    cal = posthoc.fit("vector", LOGITS, LABELS)
    with pytest.raises(ValueError) as err:
        cal.apply(LOGITS[:, :3])
    assert "fitted for K = 4 classes" in _one_line(err.value)
    cal = posthoc.fit("ts", LOGITS, LABELS)
    cal = cal.replace(params={"temperature": -cal.params["temperature"]})
    cal.save(tmp_path / "negated.npz")
    with pytest.raises(ValueError) as err:
        posthoc.load(tmp_path / "negated.npz")
    assert "params['temperature'] must be finite and > 0" in _one_line(err.value)


# ---------------------------------------------------------------------------
# OOD scores: names, member logits, temperature.
# ---------------------------------------------------------------------------

MEMBERS = RNG.normal(size=(3, 16, 4)).astype(np.float32)


def test_ood_score_bad_names_members_and_temperature_are_one_line():
    with pytest.raises(ValueError) as err:
        metrics.ood_score("odin", LOGITS)
    assert "known scores (OOD_SCORES): msp, max_logit, energy" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        metrics.ood_score("mutual_information", LOGITS)
    assert "needs member_logits" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        metrics.ood_score("mutual_information", LOGITS, member_logits=LOGITS)
    assert "member_logits must have shape [M, N, K]" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        metrics.ood_score("mutual_information", LOGITS, member_logits=MEMBERS[:, :8])
    assert "[N, K] = (16, 4) (the shape of logits), got shape (3, 8, 4)" in _one_line(
        err.value
    )
    with pytest.raises(ValueError) as err:
        metrics.energy_score(LOGITS, temperature=0.0)
    assert "temperature must be > 0, got 0.0" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        metrics.ood_score("entropy", _with(4, np.nan))
    assert "logits contains NaN or inf in 1 row(s) (first: row 4)" in _one_line(
        err.value
    )


# ---------------------------------------------------------------------------
# Calibration tests and decompositions: mode, score, K, num_samples.
# ---------------------------------------------------------------------------

PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: metrics.spiegelhalter_test(PROBS, LABELS, mode="multiclass"),
            "mode must be one of ('top_label', 'binary'), got 'multiclass'",
        ),
        (
            lambda: metrics.corp_decomposition(PROBS, LABELS, mode="classwise"),
            "mode must be one of ('top_label', 'binary'), got 'classwise'",
        ),
        (
            lambda: metrics.corp_decomposition(PROBS, LABELS, score="crps"),
            "score must be one of ('brier', 'log'), got 'crps'",
        ),
        (
            lambda: metrics.spiegelhalter_test(PROBS, LABELS, mode="binary"),
            "mode='binary' needs probs with K = 2 columns (got K = 4)",
        ),
        (
            lambda: metrics.corp_decomposition(PROBS, LABELS, mode="binary"),
            "mode='binary' needs probs with K = 2 columns (got K = 4)",
        ),
        (
            lambda: metrics.ece_consistency_test(
                PROBS, LABELS, key=jax.random.key(0), num_samples=0
            ),
            "num_samples must be >= 1, got 0",
        ),
        (
            lambda: metrics.ece_consistency_test(
                PROBS, LABELS, key=jax.random.key(0), num_samples=1.5
            ),
            "num_samples must be a Python int >= 1, got 1.5",
        ),
    ],
)
def test_calibration_tests_bad_options_are_one_line(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in _one_line(err.value)


# ---------------------------------------------------------------------------
# Multi-label calibration: [N, L] sigmoid logits with [N, L] 0/1 labels.
# ---------------------------------------------------------------------------

ML_LOGITS = RNG.normal(size=(12, 3)).astype(np.float32)
ML_LABELS = (RNG.random((12, 3)) < 0.5).astype(np.int32)


def _ml_labels_with(value) -> np.ndarray:
    out = ML_LABELS.astype(np.float32)
    out[4, 2] = value
    return out


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, _ml_labels_with(2.0)),
            (
                "labels must be 0 or 1 (one binary target per row and label); "
                "found 2.0 at row 4, label 2 (1 target(s) not 0/1)"
            ),
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, _ml_labels_with(0.5)),
            "found 0.5 at row 4, label 2",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS[:, 0]),
            "labels must have the shape of logits, [N, L] = (12, 3)",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS[:, :2]),
            "got shape (12, 2)",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS, binning="quantile"),
            "binning must be one of ('equal_width', 'equal_mass'), got 'quantile'",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS, average="weighted"),
            "average must be one of ('macro', 'micro', 'none'), got 'weighted'",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS, inputs="scores"),
            "inputs must be one of ('logits', 'probs'), got 'scores'",
        ),
        (
            lambda: metrics.multilabel_ece(ML_LOGITS, ML_LABELS, inputs="probs"),
            "probs must be probabilities in [0, 1] with inputs='probs'",
        ),
        (
            lambda: metrics.multilabel_ece(
                ML_LOGITS, ML_LABELS, where=np.zeros(12, bool)
            ),
            "where excludes every row",
        ),
        (
            lambda: metrics.MultilabelStats.from_batch(
                ML_LOGITS, _ml_labels_with(-1.0)
            ),
            "found -1.0 at row 4, label 2",
        ),
        (
            lambda: posthoc.fit_multilabel_temperature(ML_LOGITS, _ml_labels_with(3.0)),
            "labels must be 0 or 1",
        ),
        (
            lambda: posthoc.fit_multilabel_temperature(ML_LOGITS, ML_LABELS.T),
            "labels must have the shape of logits, [N, L] = (12, 3)",
        ),
        (
            lambda: posthoc.fit_multilabel_temperature(
                np.where(np.arange(12)[:, None] == 5, np.nan, ML_LOGITS), ML_LABELS
            ),
            "logits contains NaN or inf in 1 row(s) (first: row 5)",
        ),
    ],
)
@pytest.mark.long
def test_multilabel_bad_input_is_one_line(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in _one_line(err.value)


def test_multilabel_masked_rows_are_not_checked():
    # Rows excluded by where may hold NaN logits and any label (padding).
    logits = ML_LOGITS.copy()
    logits[0] = np.nan
    labels = ML_LABELS.copy()
    labels[0] = 9
    where = np.arange(12) > 0
    value = metrics.multilabel_ece(logits, labels, where=where)
    assert value == metrics.multilabel_ece(ML_LOGITS[1:], ML_LABELS[1:])


# ---------------------------------------------------------------------------
# Benchmark: deep ensembles, MC dropout and the calibration tests' config.
# ---------------------------------------------------------------------------


def _ensemble_config(**changes):
    from configs import benchmark_digits

    config = benchmark_digits.get_config("quick")
    config.methods = ("ce", "ensemble(ce)")
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"methods": ("focal", "ensemble(ce)")},
            (
                "config.methods has ensemble(ce), but 'ce' is not a method of the "
                "grid (config.methods); valid ensembles: ensemble(focal)."
            ),
        ),
        (
            {"methods": ("ce", "ensemble(nope)")},
            (
                "'nope' is not a method of the grid (config.methods); valid "
                "ensembles: ensemble(ce)."
            ),
        ),
        (
            {"methods": ("ce", "ensembles(ce)")},
            "Unknown method(s) 'ensembles(ce)' in the benchmark config. Valid: ce,",
        ),
        (
            {"ensemble.size": 1},
            "config.ensemble.size must be an integer >= 2, got 1.",
        ),
        (
            {"ensemble.num_groups": 0},
            "config.ensemble.num_groups must be an integer >= 1, got 0.",
        ),
        (
            {"ensemble.extra_runs": False},
            (
                "config.ensemble: 2 ensemble(s) of size 2 need the runs of seeds "
                "0..3, but config.seeds is [0, 1] and config.ensemble.extra_runs is "
                "False; valid: size x num_groups <= the seeds 0, 1, ... of "
                "config.seeds, or extra_runs=True."
            ),
        ),
        (
            {"methods": ("ce", "mc_dropout"), "mc_dropout.dropout_rate": 0.0},
            "config.mc_dropout.dropout_rate must lie in (0, 1) for method mc_dropout",
        ),
        (
            {"methods": ("ce", "mc_dropout"), "mc_dropout.num_samples": 0},
            (
                "config.mc_dropout.num_samples must be an integer >= 1 for method "
                "mc_dropout, got 0."
            ),
        ),
        (
            {"calibration_tests.num_samples": -1},
            "config.calibration_tests.num_samples must be an integer >= 0",
        ),
    ],
)
def test_benchmark_ensemble_and_mc_dropout_configs_are_one_line(
    tmp_path, changes, message
):
    from calib_jax.benchmark import runner

    with pytest.raises(ValueError) as err:
        runner.validate(_ensemble_config(**changes), tmp_path / "w")
    assert message in _one_line(err.value)
    assert not (tmp_path / "w").exists()


def test_benchmark_mc_dropout_on_a_model_without_dropout_is_one_line(tmp_path):
    from calib_jax.benchmark import runner

    config = _ensemble_config(methods=("ce", "mc_dropout"))
    config.train.model.name = "resnet20"
    with pytest.raises(ValueError) as err:
        runner.validate(config, tmp_path / "w")
    assert (
        "Method mc_dropout needs a model with dropout, but config.train.model.name "
        "is 'resnet20'; valid: mlp, cnn" in _one_line(err.value)
    )


# ---------------------------------------------------------------------------
# MC dropout in the trainer and the library: a model without dropout, bad
# sample counts, seeds and dropout rates.
# ---------------------------------------------------------------------------

_NO_DROPOUT = (
    "needs a model with dropout, but model '{}' has none "
    "(config.model.dropout_rate=0.0); set config.model.dropout_rate > 0 (models "
    "with dropout: mlp, cnn, wrn28_10, wrn26_10) or config.mc_dropout.num_samples=0."
)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"mc_dropout.num_samples": 4},
            "config.mc_dropout.num_samples=4 " + _NO_DROPOUT.format("mlp"),
        ),
        (
            {"model.name": "cnn", "mc_dropout.num_samples": 2},
            "config.mc_dropout.num_samples=2 " + _NO_DROPOUT.format("cnn"),
        ),
        (
            {"model.dropout_rate": 0.2, "mc_dropout.num_samples": -1},
            (
                "config.mc_dropout.num_samples must be an int >= 0 (0 = no MC dropout), "
                "got -1."
            ),
        ),
        (
            {
                "model.dropout_rate": 0.2,
                "mc_dropout.num_samples": 2,
                "mc_dropout.seed": -3,
            },
            "config.mc_dropout.seed must be an int >= 0, got -3.",
        ),
        (
            {"model.name": "resnet20", "model.dropout_rate": 0.2},
            (
                "config.model.dropout_rate=0.2: model 'resnet20' has no dropout; models "
                "with dropout: mlp, cnn, wrn28_10, wrn26_10."
            ),
        ),
        (
            {"model.dropout_rate": 1.0},
            "config.model.dropout_rate must be a number in [0, 1), got 1.0.",
        ),
    ],
)
def test_mc_dropout_config_errors_are_one_line_before_any_work(
    tmp_path, overrides, message
):
    config = digits_ce.get_config()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    with pytest.raises(ValueError) as err:
        setup.build(config, tmp_path / "w")
    assert message in _one_line(err.value)
    assert not (tmp_path / "w").exists()


@pytest.mark.long
def test_mc_dropout_samples_of_a_model_without_dropout_are_one_line():
    from calib_jax import models

    model = models.MLP(num_classes=4, hidden=(8,))
    x = np.zeros((2, 4), np.float32)
    variables = model.init(jax.random.key(0), x)
    with pytest.raises(ValueError) as err:
        models.mc_dropout_logits(
            model, variables, x, key=jax.random.key(1), num_samples=3
        )
    assert (
        "mc_dropout num_samples=3 needs a model with dropout, but MLP "
        "(dropout_rate=0.0) has no dropout layer" in _one_line(err.value)
    )
    with pytest.raises(ValueError) as err:
        models.mc_dropout_logits(
            model, variables, x, key=jax.random.key(1), num_samples=-1
        )
    assert "num_samples must be a positive int" in _one_line(err.value)


# ---------------------------------------------------------------------------
# Mondrian conformal, smooth_ece's convention, histogram binning's thresholds.
# ---------------------------------------------------------------------------


def test_mondrian_predictor_with_a_class_absent_from_calibration_is_one_line():
    from calib_jax import conformal

    labels = np.where(LABELS == 2, 1, LABELS)  # class 2 never labelled
    logits = np.tile(LOGITS, (4, 1))
    labels = np.tile(labels, 4)
    with pytest.raises(ValueError) as err:
        conformal.fit("aps", logits, labels, alpha=0.2, mondrian=True)
    text = _one_line(err.value)
    assert "class 2 is absent from the calibration set" in text
    assert "alpha=0.2" in text and "error, marginal, full" in text
    with pytest.raises(ValueError) as err:
        conformal.fit("thr", logits, labels, alpha=0.2, mondrian=True, absent="drop")
    assert "absent must be one of ('error', 'marginal', 'full')" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        conformal.fit("thr", logits, labels, alpha=0.2, absent="full")
    assert "mondrian=True" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        conformal.fit("thr", logits, labels, alpha=0.2, mondrian="yes")
    assert "mondrian must be True or False" in _one_line(err.value)


def test_smooth_ece_bad_convention_is_one_line():
    probs = jax.nn.softmax(LOGITS, axis=-1)
    with pytest.raises(ValueError) as err:
        metrics.smooth_ece(probs, LABELS, convention="torch")
    assert "convention must be one of ('exact', 'relplot'), got 'torch'" in _one_line(
        err.value
    )


def test_histogram_binning_bad_thresholds_is_one_line():
    with pytest.raises(ValueError) as err:
        posthoc.fit_histogram_binning(LOGITS, LABELS, thresholds="mid")
    assert "thresholds must be one of ('data', 'midpoint'), got 'mid'" in _one_line(
        err.value
    )
    with pytest.raises(ValueError) as err:
        posthoc.fit("histogram_binning", LOGITS, LABELS, thresholds="mid")
    assert "thresholds must be one of ('data', 'midpoint')" in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        posthoc.fit_histogram_binning(
            LOGITS, LABELS, binning="equal_width", thresholds="midpoint"
        )
    assert "needs binning='equal_mass'" in _one_line(err.value)


# Issue 23's bad input: a mesh whose class axis does not divide K (and one
# whose data axis does not divide N) is one line naming the argument, the mesh
# axis, its size and what was expected, before anything is placed; JAX's own
# error would come from jax.device_put.
SHARD_CASES = {
    "k": (
        (LOGITS[:, :3], LABELS),
        {},
        "x has K = 3 classes, not divisible by the 2 devices of mesh axis "
        "'vocab' (class_axis): expected K a multiple of 2; the classes are not "
        "padded (a padded class would enter the class-wise statistics), so "
        "choose a mesh axis whose size divides K.",
    ),
    "n": (
        (LOGITS[:15], LABELS[:15]),
        {"data_axis": "data"},
        "x has N = 15 rows, not divisible by the 4 devices of mesh axis 'data' "
        "(data_axis): expected N a multiple of 4; the rows are not padded (pad "
        "them and mask the padding with where=, or use data_axis=None).",
    ),
    "axis": (
        (LOGITS, LABELS),
        {"class_axis": "classes"},
        "class_axis='classes' is not an axis of the mesh; expected one of its "
        "axis names ('data', 'vocab').",
    ),
}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_shard_classes_mesh_mismatch_is_one_line(case):
    args, kw, message = SHARD_CASES[case]
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "vocab"))
    with pytest.raises(ValueError) as err:
        sharding.shard_classes(*args, mesh=mesh, **kw)
    assert _one_line(err.value) == message
