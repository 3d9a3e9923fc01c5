"""Registry, host-side validation and the ``python -m calib_jax.posthoc`` CLI."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _reference_posthoc as ref
import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import posthoc
from calib_jax.posthoc import _cli as posthoc_cli

ROOT = Path(__file__).resolve().parents[2]


def test_registry_names_and_unknown_name():
    assert set(posthoc.CALIBRATORS) == {
        "ts", "ets", "pts", "cts", "vector", "matrix", "dirichlet",
        "histogram_binning", "isotonic", "platt", "beta",
        "ts+classwise", "ets+classwise", "pts+classwise", "cts+classwise",
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown calibrator 'bogus'.*ts:sb_ece"):
        posthoc.get_calibrator("bogus")
    with pytest.raises(ValueError, match="unknown TS objective 'mse'"):
        posthoc.get_calibrator("ts:mse")
    with pytest.raises(ValueError, match="unknown calibrator 'vector\\+classwise'"):
        posthoc.get_calibrator("vector+classwise")


BAD_ARRAYS = {
    "nan": (
        lambda z, y: (np.where(np.arange(len(y))[:, None] == 3, np.nan, z), y),
        "NaN or inf in 1 row",
    ),
    "labels": (
        lambda z, y: (z, np.where(np.arange(len(y)) == 5, 7, y)),
        r"labels must lie in \[0, K\) = \[0, 4\); found 7 at row 5",
    ),
    "empty": (lambda z, y: (z[:0], y[:0]), r"empty \(N = 0\)"),
    "k1": (lambda z, y: (z[:, :1], y * 0), "K = 1 class"),
    "lengths": (lambda z, y: (z, y[:-1]), "has 200 rows but labels has 199"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARRAYS))
def test_fit_rejects_bad_input_with_one_line(case):
    z, y = overconfident(200, 4, seed=0)
    make, pattern = BAD_ARRAYS[case]
    bad_z, bad_y = make(z, y)
    with pytest.raises(ValueError, match=pattern) as err:
        posthoc.fit("ts", bad_z.astype(np.float32), bad_y.astype(np.int32))
    assert "\n" not in str(err.value)


def test_fit_rejects_unknown_option():
    z, y = overconfident(200, 4, seed=0)
    with pytest.raises(ValueError, match="unknown option"):
        posthoc.fit("cts", z, y, temperature=2.0)


# ---------------------------------------------------------------------------
# CLI on --val/--test (tests/posthoc/test_posthoc_cli.py covers --workdir)
# ---------------------------------------------------------------------------


def _cli(*args, cwd):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "calib_jax.posthoc", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    z, y = overconfident(200, 4, seed=0)
    zt, yt = overconfident(300, 4, seed=1)
    np.savez(d / "val.npz", logits=z, labels=y)
    np.savez(d / "test.npz", logits=zt, labels=yt)
    for case, (make, _) in BAD_ARRAYS.items():
        bz, by = make(z, y)
        np.savez(d / f"bad_{case}.npz", logits=bz.astype(np.float32), labels=by)
    np.savez(d / "bad_inf.npz", logits=np.where(z > 4, -np.inf, z), labels=y)
    np.savez(d / "no_labels.npz", logits=z, targets=y)
    return d


def _snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.long
def test_cli_end_to_end_table_json_and_overwrite_rule(files, capsys):
    out = files / "results"
    proc = _cli(
        "--val",
        files / "val.npz",
        "--test",
        files / "test.npz",
        "--method",
        "ts:nll",
        "--method=ts:nll+classwise",
        "--out",
        out,
        cwd=files,
    )
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    for name in ("uncalibrated", "ts:nll", "ts:nll+classwise"):
        assert name in stdout
    assert (out / "table.md").read_text() in stdout  # the printed table
    payload = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in payload["results"]}
    zt, yt = (
        np.load(files / "test.npz")["logits"],
        np.load(files / "test.npz")["labels"],
    )
    t = rows["ts:nll"]["fit"]["params"]["temperature"]
    zv, yv = np.load(files / "val.npz")["logits"], np.load(files / "val.npz")["labels"]
    assert t == pytest.approx(ref.ts_nll_optimum_scipy(zv, yv), rel=1e-3)
    assert rows["ts:nll"]["test"]["nll"] == pytest.approx(ref.nll(zt, yt, t), rel=1e-5)
    assert rows["ts:nll"]["val"]["nll"] == pytest.approx(ref.nll(zv, yv, t), rel=1e-5)
    assert rows["uncalibrated"]["test"]["nll"] == pytest.approx(
        ref.nll(zt, yt), rel=1e-5
    )
    assert (
        rows["ts:nll"]["test"]["accuracy"] == rows["uncalibrated"]["test"]["accuracy"]
    )
    assert 1.5 <= rows["ts:nll+classwise"]["fit"]["params"]["beta"] <= 2.0
    # The calibrated logits are z / T; the saved calibrator reproduces them.
    with np.load(out / "calibrated" / "ts_nll" / "test.npz") as f:
        np.testing.assert_allclose(f["logits"], zt / np.float32(t), rtol=1e-6)
        np.testing.assert_array_equal(f["labels"], yt)
    cal = posthoc.load(out / "calibrators" / "ts_nll+classwise.npz")
    assert cal.name == "ts:nll+classwise"
    with np.load(out / "calibrated" / "ts_nll+classwise" / "val.npz") as f:
        np.testing.assert_array_equal(np.asarray(cal.apply(zv)), f["logits"])
    before = _snapshot(out)

    # Existing outputs: refused without --overwrite, replaced with it.
    common = ["--val", files / "val.npz", "--test", files / "test.npz",
              "--method", "ts:ece_grid,ts:nll", "--out", out]  # fmt: skip
    refused = _cli(*common, cwd=files)
    _, stderr = refused.communicate(timeout=900)
    assert refused.returncode == 2
    assert stderr.strip().count("\n") == 0 and "--overwrite" in stderr
    assert f"output '{out / 'table.md'}' exists" in stderr
    assert _snapshot(out) == before
    code = posthoc_cli.main([*map(str, common), "--overwrite"])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["method"] for r in rows] == ["uncalibrated", "ts:ece_grid", "ts:nll"]
    t_grid = rows[1]["fit"]["params"]["temperature"]
    assert np.min(np.abs(np.arange(1, 101) / 10 - t_grid)) < 1e-6
    assert rows[2]["fit"]["params"]["temperature"] == t  # same fit, same bits
    assert (out / "calibrators" / "ts_ece_grid.npz").exists()


@pytest.mark.long
def test_cli_bad_inputs_fail_with_one_line_and_no_traceback(files, capsys):
    val, test = files / "val.npz", files / "test.npz"
    cases = {
        f"bad_{case}": ((files / f"bad_{case}.npz", test, "ts"), pattern)
        for case, (_, pattern) in BAD_ARRAYS.items()
    }
    cases["bad_inf"] = ((files / "bad_inf.npz", test, "ts"), "NaN or inf in")
    cases["inf_test"] = ((val, files / "bad_inf.npz", "ts"), "--test file .*NaN or inf")
    cases["missing_key"] = (
        (files / "no_labels.npz", test, "ts"),
        "has no array 'labels' \\(it has: logits, targets\\)",
    )
    cases["unknown_method"] = ((val, test, "bogus"), "unknown calibrator 'bogus'")
    cases["unknown_in_list"] = ((val, test, "ts,bogus"), "unknown calibrator 'bogus'")
    cases["binary_only"] = ((val, test, "platt"), "'platt' is a binary calibrator")
    cases["missing_file"] = ((files / "nope.npz", test, "ts"), "does not exist")
    for name, ((v, t, m), pattern) in cases.items():
        argv = ["--val", v, "--test", t, "--method", m, "--out", files / name]
        code = posthoc_cli.main([str(a) for a in argv])
        captured = capsys.readouterr()
        assert code == 2, (name, captured.err)
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, (name, captured.err)
        assert lines[0].startswith("error: "), (name, lines[0])
        assert re.search(pattern, lines[0]), (name, lines[0])
        assert not (files / name).exists()
    # The command itself: status 2, one line, no traceback.
    proc = _cli("--val", val, "--test", test, "--method", "bogus", cwd=files)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown calibrator 'bogus'" in lines[0], stderr
