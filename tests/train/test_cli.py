"""The training command line: a real digits run, resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest

import _cli

QUICK = (
    "--config.num_steps=30",
    "--config.checkpoint_every=5",
    "--config.log_every=5",
    "--config.shifts.corruptions=gaussian_noise",
    "--config.shifts.severities=(3,)",
)


def _one_line(stderr: str) -> str:
    """The whole of a user error's stderr: exactly one line, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _final_logits(workdir):
    with np.load(workdir / "logits" / "test.npz") as f:
        return f["logits"], f["labels"]


@pytest.mark.long
def test_digits_run_reaches_95_percent_and_logs_shifted_ece(tmp_path):
    result = _cli.run(
        "digits_ce.py",
        tmp_path,
        "--config.shifts.corruptions=gaussian_noise,contrast,pixelate",
        "--config.shifts.severities=(1,3,5)",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [
        json.loads(line)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    final = rows[-1]
    assert final["test/accuracy"] >= 0.95
    assert 0.0 <= final["test/ece"] < 0.1
    for name in ("gaussian_noise", "contrast", "pixelate"):
        for severity in (1, 3, 5):
            assert 0.0 <= final[f"shift/{name}/{severity}/ece"] <= 1.0
    assert "shift/mean/ece" in final
    # Training loss was logged and went down.
    losses = [r["loss/total"] for r in rows if "loss/total" in r]
    assert losses[-1] < losses[0]
    # Resolved config before step 0, exported logits for the post-hoc CLI.
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["loss"]["terms"] == ["cross_entropy"]
    assert config["loss"]["cross_entropy"] == {"weight": 1.0}
    logits, labels = _final_logits(tmp_path)
    assert logits.shape == (360, 10) and labels.shape == (360,)
    assert (tmp_path / "logits" / "shift_gaussian_noise_3.npz").exists()


@pytest.mark.long
def test_sigkill_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _cli.run("digits_ce.py", straight, *QUICK).returncode == 0

    proc = subprocess.Popen(
        _cli.command("digits_ce.py", killed, *QUICK, "--config.num_steps=30"),
        cwd=_cli.ROOT,
        env=_cli.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpts = killed / "checkpoints"
    deadline = time.time() + 900
    while time.time() < deadline:
        done = (
            [p for p in ckpts.glob("*") if p.name.isdigit()] if ckpts.exists() else []
        )
        if any(int(p.name) >= 10 for p in done):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    steps = sorted(int(p.name) for p in ckpts.glob("*") if p.name.isdigit())
    assert steps and max(steps) < 30, steps  # it really was interrupted

    started = time.time()
    result = _cli.run("digits_ce.py", killed, *QUICK)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [
        json.loads(line)
        for line in (killed / "metrics.jsonl").read_text().splitlines()
        if "loss/total" in line
    ]
    # Each step once: the records the killed run logged past its last
    # checkpoint were dropped when the rerun resumed.
    assert [r["step"] for r in rows] == list(range(5, 31, 5)), rows
    # It resumed: the records up to the restored checkpoint are the killed run's.
    assert all((r["time"] < started) == (r["step"] <= max(steps)) for r in rows)
    a, _ = _final_logits(straight)
    b, _ = _final_logits(killed)
    np.testing.assert_array_equal(a, b)  # bit for bit on CPU


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("--config.model.name=resnet7",), "Unknown model 'resnet7'"),
        (("--config.dataset.name=mnist",), "Unknown dataset 'mnist'"),
        (("--config.loss=({'name': 'xent'},)",), "Unknown loss 'xent'"),
        (("--config.batch_size=12",), "not divisible by the 8 devices"),
        (("--config.calibration_stats=sometimes",), "calibration_stats"),
        (
            ("--config.dataset.name=cifar10", "--config.dataset.data_dir=/nonexistent"),
            "tfds build cifar10 --file_format=array_record",
        ),
    ],
)
def test_bad_input_is_one_line_before_compute(tmp_path, overrides, message):
    result = _cli.run("digits_ce.py", tmp_path / "w", *overrides, num_devices=8)
    assert result.returncode == 2
    assert _one_line(result.stderr).startswith("error: ")
    assert message in result.stderr
    assert not (tmp_path / "w").exists()  # not even config.json


def test_config_typo_is_rejected(tmp_path):
    result = _cli.run("digits_ce.py", tmp_path, "--config.num_stepz=3")
    assert result.returncode == 2
    assert "num_stepz" in _one_line(result.stderr)


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "--config.loss=focal",
            "error: config.loss must be a tuple of term dicts, got the string "
            "'focal'; write --config.loss=\"({'name': 'focal'},)\" for that loss "
            "alone; the 'focal' method of the configs is ({'name': 'focal', "
            "'gamma': 3.0},).",
        ),
        (
            "--config.loss=({'name': 'focal'}",
            "error: config.loss: could not parse \"({'name': 'focal'}\" as a tuple "
            "of term dicts (are its brackets and quotes closed?); write e.g. "
            "--config.loss=\"({'name': 'cross_entropy'}, {'name': 'mdca', "
            "'weight': 2.0})\".",
        ),
        (
            "--config.model.kwargs.bogus=3",
            "error: --config.model.kwargs.bogus: config.model.kwargs has no field "
            "'bogus' (the options of model 'mlp': hidden, dropout_rate, dtype).",
        ),
        (
            "--config.model.kwargs={'bogus': 3}",
            "error: config.model.kwargs: MLP.__init__() got an unexpected keyword "
            "argument 'bogus'; the options of model 'mlp' are: hidden, dropout_rate, "
            "dtype.",
        ),
        (
            "--config.model.bogus=3",
            "error: --config.model.bogus: config.model has no field 'bogus' (its "
            "fields: dropout_rate, dtype, kwargs, name).",
        ),
    ],
)
def test_a_loss_string_and_an_unknown_model_option_are_explained(
    tmp_path, override, line
):
    result = _cli.run("digits_ce.py", tmp_path / "w", override)
    assert result.returncode == 2
    assert _one_line(result.stderr) == line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "--config.loss.sb_ece.temprature=0.005",
            'Did you mean "temperature" instead of "temprature"?',
        ),
        ("--config.loss.sb_ec.temperature=0.005", 'Did you mean "sb_ece"'),
    ],
)
def test_loss_hyperparameter_typo_is_one_line_with_a_suggestion(
    tmp_path, override, message
):
    result = _cli.run("digits_soft_calibration.py", tmp_path / "w", override)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert line.startswith("error: bad --config override: ") and message in line
    assert not (tmp_path / "w").exists()


@pytest.mark.long
def test_workdir_of_another_config_is_refused_and_kept(tmp_path):
    assert _cli.run("digits_ce.py", tmp_path, *QUICK).returncode == 0
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    result = _cli.run("digits_ce.py", tmp_path, *QUICK, "--config.seed=1")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert "different config" in line and "seed" in line
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


@pytest.mark.parametrize(
    "config, message",
    [
        (
            "nonexist.py",
            (
                "no such file and no shipped config of that name; shipped "
                "configs: benchmark_cifar10, "
            ),
        ),
        ("digits_ce.py:foo=1", "Unknown config argument 'foo'"),
    ],
)
def test_unloadable_config_is_one_line(tmp_path, config, message):
    result = _cli.run(config, tmp_path)
    assert result.returncode == 2
    assert message in _one_line(result.stderr)


@pytest.mark.slow
def test_rejected_config_leaves_the_workdir_and_the_corrected_command_runs(tmp_path):
    """``--config.num_epochs=0`` used to write config.json before failing, and
    the corrected command was then refused as a run of a different config."""
    workdir = tmp_path / "w"
    args = ("--config.shifts.corruptions=none", "--config.checkpoint_every=1")
    bad = _cli.run("digits_ce.py", workdir, *args, "--config.num_epochs=0")
    assert bad.returncode == 2
    assert "Set config.num_steps or config.num_epochs" in _one_line(bad.stderr)
    assert not workdir.exists()
    # The same into a workdir that holds something else: left as it was.
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    bad = _cli.run("digits_ce.py", workdir, *args, "--config.num_epochs=0")
    assert bad.returncode == 2
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
    good = _cli.run("digits_ce.py", workdir, *args, "--config.num_epochs=0.2")
    assert good.returncode == 0, good.stderr[-2000:]
    config = json.loads((workdir / "config.json").read_text())
    assert config["num_epochs"] == 0.2
    assert (workdir / "logits" / "test.npz").exists()
