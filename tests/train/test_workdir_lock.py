"""The workdir lock: one run per workdir (flock locally, a leased object in gs://)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from etils import epath

import _cli
from calib_jax.benchmark import runner
from calib_jax.train import workdir as workdir_lib
from configs import benchmark_digits

# Takes the lock of argv[1], says so on stdout, and holds it until its stdin
# closes (or it is killed).
_HOLDER = """
import sys
from calib_jax.train import workdir
held = workdir.lock(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """Starts a process that holds the lock of a directory; yields the process."""
    procs = []

    def start(path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)],
            cwd=_cli.ROOT,
            env=_cli.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        line = proc.stdout.readline()  # blocks until the lock is held
        assert line == "held\n", proc.stderr.read()[-2000:]
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_held_lock_refuses_another_run_and_a_killed_holder_leaves_none(
    tmp_path, holder
):
    proc = holder(tmp_path)
    with pytest.raises(ValueError) as err:
        workdir_lib.lock(tmp_path)
    message = str(err.value)
    assert message == (
        f"--workdir {tmp_path} is in use by another run (host "
        f"{os.uname().nodename} pid {proc.pid}); wait for it to end or use "
        "another --workdir."
    )
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    assert (tmp_path / workdir_lib.LOCK_FILE).exists()  # the file stays ...
    with workdir_lib.lock(tmp_path):  # ... but the kernel dropped its lock
        with pytest.raises(ValueError, match="is in use by another run"):
            workdir_lib.lock(tmp_path)  # also within one process
    workdir_lib.lock(tmp_path).release()  # released at the end of the block


@pytest.mark.long
def test_the_trainer_refuses_a_workdir_in_use_in_one_line(tmp_path, holder):
    proc = holder(tmp_path)
    result = _cli.run(
        "digits_ce.py",
        tmp_path,
        "--config.num_steps=4",
        "--config.shifts.corruptions=none",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        f"error: --workdir {tmp_path} is in use by another run (host "
        f"{os.uname().nodename} pid {proc.pid}); wait for it to end or use another "
        "--workdir."
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_benchmark_refuses_a_workdir_in_use(tmp_path, holder):
    config = benchmark_digits.get_config("quick")
    config.unlock()
    config.methods, config.calibrators, config.seeds = ("ce",), ("none",), (0,)
    proc = holder(tmp_path)
    with pytest.raises(ValueError, match=f"pid {proc.pid}\\); wait for it to end"):
        runner.run(config, tmp_path)
    assert not (tmp_path / "cells").exists()


def test_a_gs_lock_is_created_once_released_and_taken_over_when_expired(
    gcs_emulator, gcs_bucket
):
    url = f"{gcs_bucket}/run"
    bucket = gcs_bucket.removeprefix("gs://")
    first = workdir_lib.lock(url)
    held = json.loads(gcs_emulator.read(bucket, "run/.lock"))
    assert held["owner"] == f"host {os.uname().nodename} pid {os.getpid()}"
    assert held["expires"] > time.time() + workdir_lib.LEASE_S / 2
    with pytest.raises(ValueError, match=r"is in use by another run \(host .* lease"):
        workdir_lib.lock(url)
    first.release()
    assert gcs_emulator.objects(bucket, "run/") == []
    # A holder that died leaves its object; once its lease has expired the
    # next run takes it over, conditional on the generation it read.
    stale = json.dumps({"owner": "host gone pid 1", "expires": 0.0})
    epath.Path(f"{url}/{workdir_lib.LOCK_FILE}").write_text(stale)
    second = workdir_lib.lock(url)
    taken = json.loads(gcs_emulator.read(bucket, "run/.lock"))
    assert taken["owner"] == held["owner"] and taken["expires"] > time.time()
    # A write conditional on an older generation (a run that read the stale
    # lock too) fails: two runs never both take it.
    with pytest.raises(FileExistsError):
        second._put(second._generation - 1)
    with pytest.raises(FileExistsError):
        second._put(0)
    second.release()
    assert gcs_emulator.objects(bucket, "run/") == []
    # A holder on this host whose process ended (SIGKILL) is taken over at
    # once, its lease notwithstanding; a live one is not.
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    for pid, free in ((int(ended.stdout), True), (os.getpid(), False)):
        epath.Path(f"{url}/{workdir_lib.LOCK_FILE}").write_text(
            json.dumps(
                {
                    "owner": f"host {os.uname().nodename} pid {pid}",
                    "host": os.uname().nodename,
                    "pid": pid,
                    "expires": time.time() + 3600,
                }
            )
        )
        if free:
            workdir_lib.lock(url).release()
        else:
            with pytest.raises(ValueError, match=f"pid {pid}, lease ends in"):
                workdir_lib.lock(url)
