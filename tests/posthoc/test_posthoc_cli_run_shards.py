"""``python -m calib_jax.posthoc`` on the per-process logit shards of a run of
several processes (``logits/<set>.process-<i>-of-<n>.npz``), and on ``--test``
shards: the calibrators and the report of the run's single-file export."""

from __future__ import annotations

import json

import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import logit_layout
from calib_jax.posthoc import _cli as posthoc_cli

K = 6
N_VAL, N_TEST, N_SHIFT = 700, 460, 300
BATCH = 40  # global eval batch: 20 rows per process, as the export interleaves
PROCESSES = 2
SETS = {"val": (N_VAL, 0), "test": (N_TEST, 1), "shift/gaussian_noise/3": (N_SHIFT, 2)}


def _run(capsys, *argv):
    code = posthoc_cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _process_rows(n: int, process: int) -> np.ndarray:
    """The set's rows process ``process`` exports: its ``BATCH / PROCESSES``
    rows of every global batch (``train.evaluate``'s positions)."""
    local = BATCH // PROCESSES
    starts = np.arange(0, n, BATCH) + process * local
    rows = (starts[:, None] + np.arange(local)[None, :]).ravel()
    return rows[rows < n].astype(np.int64)


def _workdirs(root, sets=SETS):
    """A one-process workdir and the same sets as two processes' shards."""
    single, sharded = root / "single" / "logits", root / "sharded" / "logits"
    single.mkdir(parents=True)
    sharded.mkdir(parents=True)
    data = {}
    for key, (n, seed) in sets.items():
        z, y = overconfident(n, K, seed=seed)
        # Softmax piled at 1: the confident rows of a trained classifier.
        z[: n // 4] *= np.float32(4.0)
        data[key] = (z, y)
        np.savez(single / logit_layout.logits_file(key), logits=z, labels=y)
        for i in range(PROCESSES):
            rows = _process_rows(n, i)
            name = logit_layout.shard_file(key, "", i, PROCESSES)
            np.savez(sharded / name, logits=z[rows], labels=y[rows], rows=rows)
    return single.parent, sharded.parent, data


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("run_shards")
    single, sharded, data = _workdirs(root)
    return root, single, sharded, data


def _results(capsys, out, *argv):
    code, stdout, stderr = _run(capsys, *argv, "--method", "ts", "--out", out)
    assert code == 0, stderr
    assert stdout.rstrip().endswith(f"wrote {out}")
    return json.loads((out / "results.json").read_text()), stdout


def _assert_same_report(got, ref, splits):
    for row, want in zip(got["results"], ref["results"], strict=True):
        assert row["method"] == want["method"]
        for split in splits:
            for metric, value in want[split].items():
                assert row[split][metric] == pytest.approx(value, rel=1e-6, abs=1e-7)
            # Counts are exact: the accuracy is a count over N.
            assert row[split]["accuracy"] == want[split]["accuracy"]
        if want["fit"] is not None:
            assert row["fit"]["name"] == want["fit"]["name"]
            t, t_ref = (r["fit"]["params"]["temperature"] for r in (row, want))
            assert t == pytest.approx(t_ref, rel=1e-5)


def _nll_and_brier(z, y, t):
    """Float64 NLL and Brier score of ``softmax(z / t)``, and dNLL/d(log t)."""
    z = z.astype(np.float64) / t
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    nll = -np.log(p[rows, y]).mean()
    onehot = np.eye(z.shape[1])[y]
    brier = ((p - onehot) ** 2).sum(axis=1).mean()
    # d/du of -log softmax(z0 e^{-u})_y at u = log t is z_y - sum_j p_j z_j.
    grad = (z[rows, y] - (p * z).sum(axis=1)).mean()
    return nll, brier, grad


@pytest.mark.long
def test_a_two_process_workdir_fits_ts_and_scores_test_from_its_shards(
    tmp_path, capsys
):
    """The fast check: the fitted T is the float64 NLL minimum of the set the
    shards make up, and the test metrics are the float64 ones of z / T."""
    sets = {"val": (512, 0), "test": (512, 1)}  # one shape: one compile
    _, sharded, data = _workdirs(tmp_path, sets)
    got, _ = _results(capsys, tmp_path / "out", "--workdir", sharded)
    row = got["results"][1]
    t = row["fit"]["params"]["temperature"]
    z, y = data["val"]
    _, _, grad = _nll_and_brier(z, y, t)
    assert abs(grad) < 1e-4
    z, y = data["test"]
    nll, brier, _ = _nll_and_brier(z, y, t)
    accuracy = float(np.mean(np.argmax(z.astype(np.float64), -1) == y))
    assert row["test"]["accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert row["test"]["nll"] == pytest.approx(nll, rel=1e-5)
    assert row["test"]["brier"] == pytest.approx(brier, rel=1e-5)
    nll, brier, _ = _nll_and_brier(z, y, 1.0)
    assert got["results"][0]["test"]["nll"] == pytest.approx(nll, rel=1e-5)
    assert got["results"][0]["test"]["brier"] == pytest.approx(brier, rel=1e-5)


@pytest.mark.long
def test_a_run_of_two_processes_gives_the_single_file_calibrator_and_report(
    runs, capsys
):
    root, single, sharded, _ = runs
    ref, _ = _results(capsys, root / "out_single", "--workdir", single)
    got, stdout = _results(capsys, root / "out_sharded", "--workdir", sharded)
    logits = sharded / "logits"
    assert f"## test: {logits}/test.process-*-of-2.npz" in stdout
    assert got["inputs"]["val"] == [
        str(logits / f"val.process-{i}-of-2.npz") for i in range(PROCESSES)
    ]
    assert got["inputs"]["shift/gaussian_noise/3"][1].endswith(
        "shift_gaussian_noise_3.process-1-of-2.npz"
    )
    _assert_same_report(got, ref, ("val", "test", "shift_mean"))
    assert sorted(got["results"][1]["shift"]) == ["gaussian_noise/3"]
    # The fitted calibrator file of the single-file run, byte for byte.
    assert (root / "out_sharded" / "calibrators" / "ts.npz").read_bytes() == (
        root / "out_single" / "calibrators" / "ts.npz"
    ).read_bytes()
    # No calibrated copy of a sharded set.
    assert got["results"][1]["calibrated"] == {}
    assert not (root / "out_sharded" / "calibrated" / "ts" / "test.npz").exists()


@pytest.mark.long
def test_test_shards_given_directly_score_like_the_test_file(runs, capsys):
    root, single, sharded, data = runs
    logits = single / "logits"
    ref, _ = _results(
        capsys,
        root / "out_files",
        "--val",
        logits / "val.npz",
        "--test",
        logits / "test.npz",
    )
    shards = ",".join(
        str(sharded / "logits" / f"test.process-{i}-of-2.npz") for i in range(2)
    )
    got, stdout = _results(
        capsys,
        root / "out_test_shards",
        "--val",
        logits / "val.npz",
        "--test",
        shards,
    )
    assert f"## test: {shards}" in stdout
    _assert_same_report(got, ref, ("val", "test"))
    assert (root / "out_test_shards" / "calibrators" / "ts.npz").read_bytes() == (
        root / "out_files" / "calibrators" / "ts.npz"
    ).read_bytes()
    # The calibrated test accuracy is the float64 count of the test set.
    z, y = data["test"]
    accuracy = float(np.mean(np.argmax(z.astype(np.float64), -1) == y))
    assert got["results"][1]["test"]["accuracy"] == pytest.approx(accuracy, abs=1e-7)
    assert got["results"][1]["calibrated"] == {"val": "calibrated/ts/val.npz"}


def test_a_missing_process_shard_is_one_line_naming_it(tmp_path, capsys):
    _, sharded, _ = _workdirs(tmp_path)
    missing = sharded / "logits" / "test.process-1-of-2.npz"
    kept = missing.read_bytes()
    missing.unlink()
    out = tmp_path / "out"
    code, stdout, stderr = _run(
        capsys, "--workdir", sharded, "--method", "ts", "--out", out
    )
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("error: ")
    assert f"{missing} is missing" in stderr
    assert not out.exists()
    # Every shard back: other methods than TS need the logits in memory.
    missing.write_bytes(kept)
    code, _, stderr = _run(capsys, "--workdir", sharded, "--method", "ts,ets")
    assert code == 2 and stderr.count("\n") == 1
    assert "only TS fits stream over shards" in stderr and "--method ets" in stderr
    assert not (sharded / "posthoc").exists()
