"""A gs:// workdir end to end, against the GCS API emulator of tests/_gcs.py.

Train on ``gs://<bucket>/run``, SIGKILL after a checkpoint reached the
bucket, rerun (resumes from the bucket), export logits to the bucket, and
calibrate them with the post-hoc CLI (``--workdir`` and ``--val/--test``)
reading from and writing to the bucket; nothing may be written under the
local working directory. The bucket is inspected over the emulator's HTTP
API, not through the code tested.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time

import _cli
import _gcs
import jax
import numpy as np
import pytest

from calib_jax.train import loop
from calib_jax.train import setup as setup_lib
from calib_jax.train.checkpoint import Checkpointer
from configs import digits_ce

NUM_STEPS = 800
STEPS = (
    f"--config.num_steps={NUM_STEPS}",
    "--config.checkpoint_every=50",
    "--config.log_every=10",
    "--config.shifts.corruptions=gaussian_noise",
    "--config.shifts.severities=(3,)",
)


def _committed_steps(emulator, bucket: str) -> list[int]:
    """Steps whose Orbax checkpoint finished (``<step>/commit_success.txt``)."""
    names = emulator.objects(bucket, "run/checkpoints/")
    return sorted(
        int(parts[2])
        for parts in (name.split("/") for name in names)
        if len(parts) == 4 and parts[2].isdigit() and parts[3] == "commit_success.txt"
    )


def _rows(emulator, bucket: str) -> list[dict]:
    text = emulator.read(bucket, "run/metrics.jsonl").decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data)) as f:
        return {k: f[k] for k in f.files}


def _posthoc(cwd, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "calib_jax.posthoc", *args]
    command += ["--method", "ts:nll", "--method", "ts:sb_ece"]
    return subprocess.run(
        command,
        cwd=cwd,
        env=_cli.env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def _without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


def _without_seconds(row: dict) -> dict:
    if row["fit"] is None:
        return row
    return {**row, "fit": _without(row["fit"], "seconds")}


def _gs_named_paths(root) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        found += [
            os.path.join(directory, n) for n in dirs + files if n.startswith("gs:")
        ]
    return found


@pytest.mark.slow
def test_gs_workdir_sigkill_resume_export_and_posthoc(
    gcs_emulator, gcs_bucket, tmp_path
):
    bucket = gcs_bucket[len("gs://") :]
    workdir = f"{gcs_bucket}/run"
    cwd = tmp_path / "cwd"  # the working directory of every command
    cwd.mkdir()

    # ---- train on the bucket; SIGKILL once a checkpoint is committed there --------
    proc = subprocess.Popen(
        _cli.command("digits_ce.py", workdir, *STEPS),
        cwd=cwd,
        env=_cli.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 900
        while not _committed_steps(gcs_emulator, bucket):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint reached the bucket"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    committed = _committed_steps(gcs_emulator, bucket)
    assert committed and committed[-1] < NUM_STEPS, committed  # really interrupted
    assert not gcs_emulator.objects(bucket, "run/logits/")
    config = json.loads(gcs_emulator.read(bucket, "run/config.json"))
    assert config["num_steps"] == NUM_STEPS
    rows_before = _rows(gcs_emulator, bucket)

    # ---- rerun: resumes from the bucket and finishes -------------------------------
    resumed = subprocess.run(
        _cli.command("digits_ce.py", workdir, *STEPS),
        cwd=cwd,
        env=_cli.env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(gcs_emulator, bucket)
    # The killed run's records up to the restored checkpoint are kept; the
    # ones past it were dropped and logged again: every step once.
    kept = [r for r in rows_before if r["step"] <= committed[-1]]
    assert rows[: len(kept)] == kept
    new_steps = [r["step"] for r in rows[len(kept) :] if "loss/total" in r]
    # The first row of the rerun follows the newest committed checkpoint (a
    # restart from scratch would log step 10 again).
    assert new_steps[0] == committed[-1] + 10, (committed, new_steps)
    assert new_steps[-1] == NUM_STEPS
    train_steps = [r["step"] for r in rows if "loss/total" in r]
    assert train_steps == list(range(10, NUM_STEPS + 1, 10))
    assert _committed_steps(gcs_emulator, bucket)[-1] == NUM_STEPS
    names = gcs_emulator.objects(bucket, "run/logits/")
    assert names == [
        "run/logits/shift_gaussian_noise_3.npz",
        "run/logits/test.npz",
        "run/logits/val.npz",
    ]

    # ---- the same run, uninterrupted, on a local disk: bit for bit -----------------
    local = tmp_path / "straight"
    straight = _cli.run("digits_ce.py", local, *STEPS)
    assert straight.returncode == 0, straight.stderr[-3000:]
    remote_labels = {}
    for name in ("val", "test", "shift_gaussian_noise_3"):
        remote = _npz(gcs_emulator.read(bucket, f"run/logits/{name}.npz"))
        remote_labels[name] = remote["labels"]
        with np.load(local / "logits" / f"{name}.npz") as f:
            np.testing.assert_array_equal(remote["logits"], f["logits"])
            np.testing.assert_array_equal(remote["labels"], f["labels"])
    local_rows = [
        json.loads(line) for line in (local / "metrics.jsonl").read_text().splitlines()
    ]
    assert _without(rows[-1], "time") == _without(local_rows[-1], "time")

    # ---- post-hoc calibration from the bucket, output into the bucket --------------
    result = _posthoc(cwd, f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {workdir}/posthoc" in result.stdout
    payload = json.loads(gcs_emulator.read(bucket, "run/posthoc/results.json"))
    assert payload["inputs"]["test"] == f"{workdir}/logits/test.npz"
    results = {r["method"]: r for r in payload["results"]}
    assert sorted(results) == ["ts:nll", "ts:sb_ece", "uncalibrated"]
    test = _npz(gcs_emulator.read(bucket, "run/logits/test.npz"))
    accuracy = np.mean(np.argmax(test["logits"], -1) == test["labels"])
    for row in results.values():  # temperature scaling keeps the arg-max
        assert row["test"]["accuracy"] == pytest.approx(accuracy, rel=1e-6)
        assert list(row["shift"]) == ["gaussian_noise/3"]
    assert gcs_emulator.read(bucket, "run/posthoc/table.md").decode() in result.stdout
    for method in ("ts_nll", "ts_sb_ece"):
        assert f"run/posthoc/calibrators/{method}.npz" in gcs_emulator.objects(
            bucket, "run/posthoc/calibrators/"
        )
        for split in ("val", "test", "shift_gaussian_noise_3"):
            calibrated = _npz(
                gcs_emulator.read(
                    bucket, f"run/posthoc/calibrated/{method}/{split}.npz"
                )
            )
            np.testing.assert_array_equal(calibrated["labels"], remote_labels[split])
    # The same command on the local copy of the run gives the same numbers.
    local_out = tmp_path / "local_posthoc"
    result = _posthoc(cwd, f"--workdir={local}", f"--out={local_out}")
    assert result.returncode == 0, result.stderr[-3000:]
    local_results = json.loads((local_out / "results.json").read_text())["results"]
    assert [_without_seconds(r) for r in payload["results"]] == [
        _without_seconds(r) for r in local_results
    ]
    # --val/--test in the bucket: the default output is beside the test file.
    result = _posthoc(
        cwd,
        "--val",
        f"{workdir}/logits/val.npz",
        "--test",
        f"{workdir}/logits/test.npz",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {workdir}/logits/test_posthoc" in result.stdout
    pair = json.loads(gcs_emulator.read(bucket, "run/logits/test_posthoc/results.json"))
    assert [r["test"] for r in pair["results"]] == [
        r["test"] for r in payload["results"]
    ]

    # ---- nothing under the local working directory; no 'gs:' path anywhere --------
    assert sorted(os.listdir(cwd)) == []
    assert _gs_named_paths(tmp_path) == []
    assert _gs_named_paths(_cli.ROOT) == []


@pytest.mark.slow
def test_unreachable_storage_is_one_line_before_training(gcs_emulator, tmp_path):
    """A store that does not answer: one line after the bounded wait, no training."""
    dead = f"http://127.0.0.1:{_gcs.free_port()}"
    result = subprocess.run(
        _cli.command("digits_ce.py", "gs://some-bucket/run", *STEPS),
        cwd=tmp_path,
        env=dict(_cli.env(), STORAGE_EMULATOR_HOST=dead),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(
        "error: --workdir gs://some-bucket/run: no answer about bucket gs://some-bucket"
    )
    assert os.listdir(tmp_path) == []


# Two in-process trainings (about 20 s).
@pytest.mark.slow
def test_unreadable_checkpoint_in_a_bucket_is_set_aside(
    gcs_emulator, gcs_bucket, caplog
):
    """The local rule (tests/train/test_preemption.py) on gs://: skip, move aside, redo.

    (A failed restore can leave tensorstore reads in flight that complete after
    Orbax closed its event loop; pytest may then report an ignored
    "Event loop is closed" from asyncio. It is harmless and not ours.)
    """
    bucket = gcs_bucket[len("gs://") :]
    workdir = f"{gcs_bucket}/run"
    config = digits_ce.get_config()
    config.num_steps, config.checkpoint_every = 30, 10
    config.shifts.corruptions = "none"
    loop.train_and_evaluate(config, workdir, progress=False)
    assert _committed_steps(gcs_emulator, bucket) == [10, 20, 30]
    # Damage the newest checkpoint: drop its array data.
    data = [
        n for n in gcs_emulator.objects(bucket, "run/checkpoints/30/") if "/d/" in n
    ]
    assert data
    for name in data:
        gcs_emulator.delete(bucket, name)
    run = setup_lib.build(config, workdir)
    ckpt = Checkpointer(workdir)
    with caplog.at_level(logging.WARNING):
        state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    assert int(jax.device_get(state.step)) == 20
    assert any(f"{workdir}/checkpoints/30" in r.getMessage() for r in caplog.records)
    # Moved (copied, then deleted) with its remaining objects.
    assert not gcs_emulator.objects(bucket, "run/checkpoints/30/")
    aside = gcs_emulator.objects(bucket, "run/checkpoints_unreadable/30/")
    assert "run/checkpoints_unreadable/30/commit_success.txt" in aside
    # Resuming retrains steps 21..30 and saves step 30 again, readable this time.
    loop.train_and_evaluate(config, workdir, progress=False)
    ckpt = Checkpointer(workdir)
    state = ckpt.restore_latest(run.abstract_state)
    ckpt.close()
    assert int(jax.device_get(state.step)) == 30
