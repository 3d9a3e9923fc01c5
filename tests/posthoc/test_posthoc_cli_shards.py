"""``python -m calib_jax.posthoc --val <shards>``: validation logits as a glob
or a list of ``.npy``/``.npz`` shards give the calibrators of one ``.npz``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import chunks
from calib_jax.posthoc import _cli as posthoc_cli

K = 5
N = 700
CUTS = ((0, 250), (250, 520), (520, N))  # no cut a multiple of a chunk
METHODS = "ts,ts:sb_ece"


def _run(capsys, *argv):
    code = posthoc_cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write(tmp_path):
    """val.npz, test.npz, and val as .npy shards and as .npz shards."""
    (z, y), (zt, yt) = overconfident(N, K, seed=0), overconfident(300, K, seed=1)
    np.savez(tmp_path / "val.npz", logits=z, labels=y)
    np.savez(tmp_path / "test.npz", logits=zt, labels=yt)
    npz = []
    for i, (a, b) in enumerate(CUTS):
        np.save(tmp_path / f"val-{i}.npy", z[a:b])
        np.save(tmp_path / f"val-{i}{chunks.LABELS_SUFFIX}", y[a:b])
        npz.append(str(tmp_path / f"part-{i}.npz"))
        np.savez(npz[-1], logits=z[a:b], labels=y[a:b])
    return ",".join(npz)


@pytest.mark.long
def test_a_glob_and_a_list_of_shards_give_the_calibrators_of_one_npz(tmp_path, capsys):
    listed = _write(tmp_path)
    test = tmp_path / "test.npz"
    runs = {
        "one": tmp_path / "val.npz",
        "glob": str(tmp_path / "val-*.npy"),
        "list": listed,
    }
    results = {}
    for key, val in runs.items():
        out = tmp_path / key
        code, stdout, stderr = _run(
            capsys, "--val", val, "--test", test, "--method", METHODS, "--out", out
        )
        assert code == 0, stderr
        assert stdout.rstrip().endswith(f"wrote {out}")
        results[key] = json.loads((out / "results.json").read_text())
    one = results["one"]
    for key in ("glob", "list"):
        out, got = tmp_path / key, results[key]
        assert got["inputs"] == {"val": str(runs[key]), "test": str(test)}
        for name in ("ts", "ts_sb_ece"):
            # The fitted calibrator file, byte for byte.
            assert (out / "calibrators" / f"{name}.npz").read_bytes() == (
                tmp_path / "one" / "calibrators" / f"{name}.npz"
            ).read_bytes()
        assert not (out / "calibrated" / "ts" / "val.npz").exists()
        for row, ref in zip(got["results"], one["results"]):
            assert row["method"] == ref["method"]
            assert row["test"] == ref["test"]
            if ref["fit"] is None:
                assert row["fit"] is None
            else:
                for field in ("name", "params", "warnings"):
                    assert row["fit"][field] == ref["fit"][field]
            assert sorted(row["calibrated"]) == ([] if row["fit"] is None else ["test"])
            # Val metrics streamed from logits: float32 rounding of the sums.
            for metric, value in ref["val"].items():
                assert row["val"][metric] == pytest.approx(value, rel=1e-5, abs=1e-7)


def test_shards_refuse_other_methods_test_shards_and_keys_in_one_line(tmp_path, capsys):
    _write(tmp_path)
    glob, test = str(tmp_path / "val-*.npy"), tmp_path / "test.npz"
    cases = [
        (("--method", "ts,ets"), "only TS fits stream over shards"),
        (("--method", "ts", "--objective", "hb_ece"), "--method ts:hb_ece"),
        (("--method", "ts", "--logits_key", "z"), "--logits_key"),
    ]
    for extra, needle in cases:
        code, _, stderr = _run(capsys, "--val", glob, "--test", test, *extra)
        assert code == 2
        assert len(stderr.strip().splitlines()) == 1 and needle in stderr
    code, _, stderr = _run(
        capsys, "--val", tmp_path / "val.npz", "--test", glob, "--method", "ts,ets"
    )
    assert code == 2 and "only TS fits stream over shards" in stderr
    code, _, stderr = _run(
        capsys, "--val", tmp_path / "val.npz", "--test", glob, "--method", "ts"
    )
    assert code == 2 and "give --out" in stderr
    code, _, stderr = _run(
        capsys,
        "--val",
        tmp_path / "none-*.npy",
        "--test",
        test,
        "--method",
        "ts",
        "--out",
        tmp_path / "out",
    )
    assert code == 2 and "matches no file" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
