"""A full disk while metrics.jsonl is appended, and a workdir that takes no writes.

The failures are injected (a patched write raising the OSError the kernel
would give), in this process or, for the command line, through a
``sitecustomize`` module the run imports at start-up.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import textwrap

import pytest

import _cli
from calib_jax import storage
from calib_jax.train import metrics_log

QUICK = (
    "--config.num_steps=20",
    "--config.log_every=5",
    "--config.checkpoint_every=10",
    "--config.shifts.corruptions=none",
)


def _torn_append(path_text: str):
    """An ``append_text`` that writes half of its text, then finds the disk full."""

    def append(path, text):
        with open(path, "a") as f:
            f.write(text[: len(text) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path_text)

    return append


def test_a_failed_append_is_cut_back_to_whole_records(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = metrics_log.JsonlWriter(path)
    writer.write(5, {"loss/total": 1.5})
    before = path.read_text()
    monkeypatch.setattr(storage, "append_text", _torn_append(str(path)))
    with pytest.raises(metrics_log.MetricsWriteError) as err:
        writer.write(10, {"loss/total": 1.25})
    assert str(err.value) == (
        f"could not append to {path}: No space left on device; free space and "
        "rerun the same command to resume from the last checkpoint."
    )
    assert path.read_text() == before  # the torn half was cut off
    assert [r["step"] for r in metrics_log.load_jsonl(path)] == [5]


def test_a_torn_line_that_stays_is_dropped_on_resume(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = metrics_log.JsonlWriter(path)
    writer.write(5, {"loss/total": 1.5})
    monkeypatch.setattr(storage, "append_text", _torn_append(str(path)))

    def no_truncate(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "truncate", no_truncate)
    with pytest.raises(metrics_log.MetricsWriteError):
        writer.write(10, {"loss/total": 1.25})
    monkeypatch.undo()
    assert not path.read_text().endswith("\n")  # torn
    writer.truncate_after(5)
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [5]
    assert path.read_text().endswith("\n")


def test_a_failed_rewrite_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = metrics_log.JsonlWriter(path)
    writer.write(5, {"test/ece": 0.5})
    before = path.read_text()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage, "write_text", full)
    with pytest.raises(metrics_log.MetricsWriteError) as err:
        writer.write(5, {"test/ece": 0.25}, replace=True)  # a rerun's final eval
    assert str(err.value) == (
        f"could not rewrite {path}: No space left on device; free space and "
        "rerun the same command to resume from the last checkpoint."
    )
    assert path.read_text() == before


def _run_with(site: str, workdir, tmp_path) -> subprocess.CompletedProcess:
    """The trainer on ``workdir`` with ``site`` run at start-up (sitecustomize)."""
    inject = tmp_path / "inject"
    inject.mkdir(exist_ok=True)
    (inject / "sitecustomize.py").write_text(textwrap.dedent(site))
    env = _cli.env()
    env["PYTHONPATH"] = os.pathsep.join([str(inject), env["PYTHONPATH"]])
    return subprocess.run(
        _cli.command("digits_ce.py", workdir, *QUICK),
        cwd=_cli.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.long
def test_a_full_disk_on_metrics_is_one_line_exit_4_and_the_rerun_resumes(tmp_path):
    workdir = tmp_path / "run"
    metrics = workdir / "metrics.jsonl"
    # The third append (step 15) writes half a record, then the disk is full.
    full = """
        import errno, os
        from calib_jax import storage
        append, calls = storage.append_text, []
        def full(path, text):
            calls.append(path)
            if len(calls) < 3:
                return append(path, text)
            with open(path, "a") as f:
                f.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        storage.append_text = full
    """
    failed = _run_with(full, workdir, tmp_path)
    assert failed.returncode == 4, failed.stderr[-3000:]
    assert _errors(failed.stderr) == [
        f"error: could not append to {metrics}: No space left on device; free "
        "space and rerun the same command to resume from the last checkpoint."
    ]
    assert "Traceback" not in failed.stderr
    text = metrics.read_text()
    assert text.endswith("\n")
    assert [json.loads(ln)["step"] for ln in text.splitlines()] == [5, 10]
    resumed = _cli.run("digits_ce.py", workdir, *QUICK)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    train = [r["step"] for r in metrics_log.load_jsonl(metrics) if "loss/total" in r]
    assert train == [5, 10, 15, 20]


def test_a_workdir_that_takes_no_writes_is_one_line_before_any_compute(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    # As root, chmod does not stop writes: the file system's answer to a file
    # written in the workdir is injected.
    read_only = f"""
        import errno, os
        from etils import epath
        local = type(epath.Path("/"))
        write = local.write_bytes
        def read_only(path, data):
            if str(path).startswith({str(workdir)!r}):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return write(path, data)
        local.write_bytes = read_only
    """
    result = _run_with(read_only, workdir, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert _errors(result.stderr) == [
        f"error: --workdir {workdir} is not writable: Read-only file system."
    ]
    assert "Traceback" not in result.stderr and "train " not in result.stderr
    assert sorted(os.listdir(workdir)) == []
