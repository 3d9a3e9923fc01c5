"""``python -m calib_jax.posthoc`` when things go wrong: a full disk while an
output is written, Ctrl-C, an unwritable ``--out``, sizes that cannot fit in
memory, a workdir of a run that stopped before its first checkpoint. Each
ends with one line and leaves no output of the failed run behind.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from posthoc._data import overconfident

from calib_jax import _cli, _memory, posthoc, storage
from calib_jax.posthoc import _cli as posthoc_cli
from calib_jax.posthoc import _cli_files, _dirichlet

K = 5
N = 200


@pytest.fixture
def inputs(tmp_path):
    """``--val``/``--test`` files of ``K`` classes."""
    for seed, name in enumerate(("val", "test")):
        z, y = overconfident(N, K, seed=seed)
        np.savez(tmp_path / f"{name}.npz", logits=z, labels=y)
    return tmp_path


def _main(capsys, inputs, *argv):
    args = ["--val", inputs / "val.npz", "--test", inputs / "test.npz", *argv]
    code = posthoc_cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _files(root) -> list[str]:
    """Every file under ``root``, relative, sorted (temporary ones included)."""
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, names in os.walk(root)
        for f in names
    )


EXPECTED = [
    "calibrated/ts_nll/test.npz",
    "calibrated/ts_nll/val.npz",
    "calibrators/ts_nll.npz",
    "results.json",
    "table.md",
]


def _fail_writing(monkeypatch, name: str, error: BaseException) -> None:
    """Writing the temporary file of output ``name`` writes half of it, then
    raises ``error``."""
    real = epath.Path.write_bytes

    def write_bytes(self, data):
        if self.name.startswith(f".{name}.") and self.name.endswith(".tmp"):
            real(self, data[: len(data) // 2])
            raise error
        return real(self, data)

    monkeypatch.setattr(epath.Path, "write_bytes", write_bytes)


@pytest.mark.long
def test_a_full_disk_leaves_no_output_and_the_rerun_works(
    inputs, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with monkeypatch.context() as patch:
        _fail_writing(patch, "test.npz", full)
        code, stdout, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == _cli.EXIT_STORAGE == 4
    assert "Traceback" not in stderr and stdout == ""
    assert stderr.strip().splitlines()[-1] == (
        f"error: cannot write '{out}/calibrated/ts_nll/test.npz': No space left on "
        "device. No output of this run was kept; rerun once the storage is writable."
    )
    # The calibrator and val.npz were written whole, then removed with the
    # run; test.npz never appeared under its name.
    assert _files(out) == []
    code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 0, stderr
    assert _files(out) == EXPECTED
    with np.load(out / "calibrated/ts_nll/test.npz") as f:
        assert f["logits"].shape == (N, K)


@pytest.mark.long
def test_ctrl_c_is_one_line_and_leaves_no_output(inputs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    # While fitting: nothing was written yet.
    with monkeypatch.context() as patch:

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        patch.setattr(posthoc, "fit", interrupted)
        code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == _cli.EXIT_INTERRUPTED == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted"
    assert _files(out) == []
    # While writing val.npz, after the calibrator was written.
    with monkeypatch.context() as patch:
        _fail_writing(patch, "val.npz", KeyboardInterrupt())
        code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 130
    assert stderr.strip().splitlines()[-1] == "interrupted"
    assert _files(out) == []


# The command, with posthoc.fit replaced by one that raises KeyboardInterrupt
# as Ctrl-C does.
_INTERRUPTED = """
import runpy, sys
from calib_jax import posthoc

def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

posthoc.fit = interrupted
sys.argv = ["posthoc", *sys.argv[1:]]
runpy.run_module("calib_jax.posthoc", run_name="__main__", alter_sys=True)
"""


@pytest.mark.long
def test_ctrl_c_ends_the_command_with_status_130(inputs, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    argv = ["--val", inputs / "val.npz", "--test", inputs / "test.npz"]
    argv += ["--method", "ts:nll", "--out", tmp_path / "out"]
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED, *map(str, argv)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "interrupted"
    assert not (tmp_path / "out").exists()


def test_temporary_files_of_a_killed_run_do_not_block_the_rerun(
    inputs, tmp_path, capsys
):
    out = tmp_path / "out"
    (out / "calibrated" / "ts_nll").mkdir(parents=True)
    leftover = out / "calibrated" / "ts_nll" / ".test.npz.12345.tmp"
    leftover.write_bytes(b"PK half")
    code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 0, stderr
    assert [f for f in _files(out) if not f.endswith(".tmp")] == EXPECTED


def test_an_existing_output_is_still_refused(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "calibrators").mkdir(parents=True)
    (out / "calibrators" / "ts_nll.npz").write_bytes(b"mine")
    code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 2
    assert stderr == (
        f"error: output '{out}/calibrators/ts_nll.npz' exists; pass --overwrite to "
        "replace it.\n"
    )
    assert (out / "calibrators" / "ts_nll.npz").read_bytes() == b"mine"


def test_an_unwritable_out_fails_before_reading_or_fitting(
    inputs, tmp_path, capsys, monkeypatch
):
    calls = []
    monkeypatch.setattr(_cli_files, "load_split", lambda *a: calls.append(a))
    monkeypatch.setattr(posthoc, "fit", lambda *a, **k: calls.append(a))
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"  # root writes anywhere, but not under a file
    code, stdout, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 2
    assert stderr == f"error: --out {out} is not writable: Not a directory.\n"
    assert stdout == "" and calls == []
    # A read-only location (the probe's write fails as on a read-only mount).
    real = epath.Path.write_bytes

    def read_only(self, data):
        if self.name.startswith(".write-check."):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(self, data)

    monkeypatch.setattr(epath.Path, "write_bytes", read_only)
    out = tmp_path / "ro" / "out"
    code, _, stderr = _main(capsys, inputs, "--method", "ts:nll", "--out", out)
    assert code == 2
    assert stderr == f"error: --out {out} is not writable: Read-only file system.\n"
    assert calls == [] and not (tmp_path / "ro").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ("--method", "ts:nll", "--num_bins", "100000000"),
            (
                "--num_bins=100000000 at K = 5 classes (the metrics' bins of "
                "every class) needs about 10.0 GB; this device has 1.0 MB "
                "available; lower --num_bins (15 is usual)."
            ),
        ),
        (
            ("--method", "ts:nll,matrix", "--num_bins", "1"),
            (
                "--method matrix at K = 5 classes (30 parameters, about 30 copies "
                "of them in the L-BFGS fit) needs about 3.6 kB; this device has "
                "1.0 kB available; use a calibrator with O(K) parameters ('ts', "
                "'ets' or 'vector')."
            ),
        ),
        (
            ("--method", "dirichlet", "--num_bins", "1"),
            "--method dirichlet at K = 5 classes (30 parameters",
        ),
    ],
)
def test_sizes_that_cannot_fit_fail_before_reading_the_logits(
    inputs, tmp_path, capsys, monkeypatch, argv, message
):
    available = 1_000_000 if "100000000" in argv else 1000
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: available)
    calls = []
    monkeypatch.setattr(_cli_files, "load_split", lambda *a: calls.append(a))
    code, stdout, stderr = _main(capsys, inputs, *argv, "--out", tmp_path / "o")
    assert code == 2
    assert stderr.startswith(f"error: {message}") and stderr.count("\n") == 1
    assert stdout == "" and calls == []
    assert not (tmp_path / "o").exists()


@pytest.mark.long
def test_sizes_within_memory_pass(inputs, tmp_path, capsys, monkeypatch):
    # 20 * K * 15 bytes of bins and 30 * 30 * 4 bytes of matrix parameters.
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 3600)
    argv = ("--method", "matrix", "--out", tmp_path / "o")
    code, _, stderr = _main(capsys, inputs, *argv)
    assert code == 0, stderr


@pytest.mark.parametrize(
    "name, fitter", [("matrix", "fit_matrix_scaling"), ("dirichlet", "fit_dirichlet")]
)
def test_library_fits_of_a_k_by_k_matrix_check_memory_first(monkeypatch, name, fitter):
    z, y = overconfident(N, K, seed=0)
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 3599)
    with pytest.raises(ValueError) as err:
        posthoc.fit(name, z, y)
    assert str(err.value) == (
        f"{fitter} at K = 5 classes (30 parameters, about 30 copies of them in the "
        "L-BFGS fit) needs about 3.6 kB; this device has 3.6 kB available; use a "
        "calibrator with O(K) parameters ('ts', 'ets' or 'vector')."
    )
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 3600)
    assert posthoc.fit(name, z, y).params["W"].shape == (K, K)


def test_odir_penalty_counts_pairs_without_int32_overflow():
    # K(K-1) = 2,499,950,000 at K = 50,000 does not fit in int32; traced
    # only (no arrays of that size are made).
    k = 50_000
    params = {
        "W": jax.ShapeDtypeStruct((k, k), jnp.float32),
        "b": jax.ShapeDtypeStruct((k,), jnp.float32),
    }
    penalty = jax.eval_shape(lambda p: _dirichlet.odir_penalty(p, 0.01, 0.01), params)
    assert penalty.shape == () and penalty.dtype == jnp.float32
    # And its value at a small K equals the formula.
    w = jnp.arange(9.0).reshape(3, 3)
    b = jnp.array([1.0, 2.0, 3.0])
    off = float(jnp.sum(w**2) - jnp.sum(jnp.diagonal(w) ** 2))
    expected = 0.5 * off / 6 + 0.25 * 14 / 3
    got = float(_dirichlet.odir_penalty({"W": w, "b": b}, 0.5, 0.25))
    assert got == pytest.approx(expected, rel=1e-6)


def test_workdir_of_a_run_that_stopped_before_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)  # as a diverged run leaves it
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    code = posthoc_cli.main(["--workdir", str(run), "--method", "ts:nll"])
    stderr = capsys.readouterr().err
    assert code == 2
    assert stderr == (
        f"error: --workdir '{run}' has no logits/val.npz and logits/test.npz and "
        "no checkpoint (its checkpoints/ is empty): the run stopped before its "
        "first checkpoint (it diverged, failed or was stopped; the train "
        "command's last line said which). Fix the cause (a diverged run needs "
        "e.g. a lower learning rate) and rerun the train command, which starts "
        "again from step 0.\n"
    )
    # An Orbax temporary directory is not a checkpoint either.
    (run / "checkpoints" / "200.orbax-checkpoint-tmp-1").mkdir()
    code = posthoc_cli.main(["--workdir", str(run), "--method", "ts:nll"])
    assert code == 2 and "no checkpoint (its" in capsys.readouterr().err
    assert not (run / "posthoc").exists()


def test_logits_shape_is_read_from_the_header_local_and_gs(
    inputs, gcs_emulator, gcs_bucket
):
    local = _cli_files.given_splits(str(inputs / "val.npz"), str(inputs / "test.npz"))
    assert _cli_files.logits_shape(local[0], "logits") == (N, K)
    assert _cli_files.logits_shape(local[0], "labels") == (N,)
    assert _cli_files.logits_shape(local[0], "nope") is None
    url = f"{gcs_bucket}/in/val.npz"
    storage.write_bytes(url, (inputs / "val.npz").read_bytes())
    remote = _cli_files.Split("val", "val.npz", storage.as_path(url), "--val")
    assert _cli_files.logits_shape(remote, "logits") == (N, K)
    (inputs / "cut.npz").write_bytes((inputs / "val.npz").read_bytes()[:200])
    cut = _cli_files.Split("val", "val.npz", storage.as_path(inputs / "cut.npz"), "x")
    assert _cli_files.logits_shape(cut, "logits") is None
