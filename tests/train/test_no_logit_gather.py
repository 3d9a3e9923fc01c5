"""End-of-run scoring without gathering logits: rows on the devices, shards on disk.

The evaluation scores each batch where its logits are (per-row values and
class-wise sums on the devices, ``calib_jax.train.scoring``) and gathers only
``[B]`` rows across processes; each process exports its own shard. Checked
against today's path, ``evaluate.score`` of the whole ``[N, K]`` logits
(``split_metrics``/``ood_metrics``): every metric bit for bit, the class-wise
ECE too (its per-bin confidence sums are exact until rounded once, so the
batches' sums merged equal the whole set's).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

import _cli
import _no_gather_worker as worker
from _processes import free_port, wait_all
from calib_jax.train import evaluate, loop
from calib_jax.train import mesh as mesh_lib
from configs import digits_ce

ROW_KEYS = ("accuracy", "nll", "ece", "adaptive_ece", "brier")
OOD_KEYS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")
TIMEOUT_S = 600


def _assert_same_metrics(got: dict, expected: dict) -> None:
    """Every key of today's ``score`` in its order, every value bit for bit."""
    assert list(got)[: len(expected)] == list(expected)
    for key, value in expected.items():
        assert got[key] == value, (key, got[key], value)


def _placed(z, y, batch):
    """Padded global batches on the data mesh (the conftest's 8 CPU devices),
    as the trainer places them."""
    sharding = mesh_lib.batch_sharding(mesh_lib.data_mesh())
    for b in range(math.ceil(len(y) / batch)):
        rows = slice(b * batch, min(len(y), (b + 1) * batch))
        n = rows.stop - rows.start
        image = np.zeros((batch, z.shape[1]), np.float32)
        label = np.zeros(batch, np.int32)
        image[:n], label[:n] = z[rows], y[rows]
        local = {"image": image, "label": label, "mask": np.arange(batch) < n}
        yield mesh_lib.put_batch(local, sharding)


_STEP = jax.jit(lambda state, images: images + 0.0)


@pytest.mark.long
def test_scoring_batches_on_device_equals_scoring_the_gathered_logits():
    # Sets of one size compile each metric once. [500, 10] is reduced on the
    # large path of XLA:CPU: the [8, 10] rows of each device are padded
    # (scoring.block_rows); the 2-process test covers the small path too.
    batch = 64
    data = worker.sets((500, 500, 500))
    results = {
        key: evaluate.collect_set(
            _STEP,
            None,
            _placed(z, y, batch),
            num_rows=len(y),
            split=key != evaluate.OOD_KEY,
            keep_logits=True,
        )
        for key, (z, y) in data.items()
    }
    got = evaluate.score_sets(results)
    _assert_same_metrics(got, evaluate.score(data))
    assert evaluate.score(data, batch_size=batch) == got
    assert [k for k in got if k.startswith("ood/")] == [f"ood/{k}" for k in OOD_KEYS]
    for key, (z, y) in data.items():  # one process keeps the whole set, in order
        np.testing.assert_array_equal(results[key].logits, z)
        np.testing.assert_array_equal(results[key].labels, y)
        np.testing.assert_array_equal(results[key].index, np.arange(len(y)))


def test_single_process_export_is_one_file_and_shards_read_back_in_order(
    tmp_path, monkeypatch
):
    z, y = worker.sets()["test"]
    # One process: <set>.npz with exactly today's fields.
    evaluate.export_logits(tmp_path / "one", {"test": (z, y)})
    with np.load(tmp_path / "one" / "test.npz") as f:
        assert sorted(f.files) == ["labels", "logits"]
    # Two processes: each writes its rows and their positions.
    for process in (1, 0):
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax, "process_index", lambda p=process: p)
        rows = worker.owned_rows(len(y), process, 2)
        extras = {"test": {evaluate.ROW_INDEX: rows}}
        evaluate.export_logits(
            tmp_path / "two", {"test": (z[rows], y[rows])}, extras=extras
        )
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert names == ["test.process-0-of-2.npz", "test.process-1-of-2.npz"]
    for layout in ("one", "two"):
        (got_z, got_y) = evaluate.read_logits(tmp_path / layout, ["test"])["test"]
        np.testing.assert_array_equal(got_z, z)
        np.testing.assert_array_equal(got_y, y)
    (tmp_path / "two" / "test.process-1-of-2.npz").unlink()
    with pytest.raises(ValueError, match=r"test.process-1-of-2.npz is missing"):
        evaluate.read_logits(tmp_path / "two", ["test"])


@pytest.mark.long
def test_two_processes_exchange_only_rows_and_score_like_one(tmp_path):
    port = free_port()
    script = str(_cli.ROOT / "tests" / "train" / "_no_gather_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), str(port), str(tmp_path)],
            cwd=_cli.ROOT,
            env=_cli.env(num_devices=2),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for code, _, stderr in wait_all(procs, TIMEOUT_S):
        assert code == 0, stderr[-3000:]
    data = worker.sets()
    expected = evaluate.score(data)
    padded = sum(
        math.ceil(len(y) / worker.BATCH) * worker.BATCH for _, y in data.values()
    )
    for process in (0, 1):
        report = json.loads((tmp_path / f"process-{process}.json").read_text())
        _assert_same_metrics(report["metrics"], expected)
        # Only [B] rows crossed between processes: no array with a class axis,
        # O(N) values in all (the split sets' 4 fields and the mask, the OOD
        # set's confidence and mask).
        assert all(shape == [worker.BATCH] for shape in report["received"])
        split = sum(
            math.ceil(len(y) / worker.BATCH) for k, (_, y) in data.items() if k != "ood"
        )
        ood = math.ceil(len(data["ood"][1]) / worker.BATCH)
        assert len(report["received"]) == 5 * split + 2 * ood
        assert padded * 5 >= worker.BATCH * len(report["received"])
        # Each shard holds exactly the rows the process was fed.
        for key, (z, y) in data.items():
            name = evaluate.shard_file(key, worker.OOD_NAME, process, 2)
            with np.load(tmp_path / "logits" / name) as f:
                rows = worker.owned_rows(len(y), process, 2)
                np.testing.assert_array_equal(f[evaluate.ROW_INDEX], rows)
                np.testing.assert_array_equal(f["logits"], z[rows])
                np.testing.assert_array_equal(f["labels"], y[rows])
    # The shards read back as the whole sets, in order: today's scoring of
    # them is the run's.
    read = evaluate.read_logits(tmp_path / "logits", list(data), worker.OOD_NAME)
    for key, (z, y) in data.items():
        np.testing.assert_array_equal(read[key][0], z)
        np.testing.assert_array_equal(read[key][1], y)


@pytest.mark.long
def test_digits_run_end_of_run_metrics_equal_scoring_its_exported_logits(tmp_path):
    config = digits_ce.get_config()
    config.num_steps = 2
    config.log_every = 1
    config.checkpoint_every = 2
    config.eval_batch_size = 64
    config.shifts.corruptions = "gaussian_noise"
    config.shifts.severities = (3,)
    summary = loop.train_and_evaluate(config, tmp_path / "w", progress=False)
    keys = ["val", "test", "shift/gaussian_noise/3"]
    logits = evaluate.read_logits(tmp_path / "w" / "logits", keys)
    assert logits["test"][0].shape[0] == 360
    with np.load(tmp_path / "w" / "logits" / "test.npz") as f:
        assert sorted(f.files) == ["labels", "logits"]
    _assert_same_metrics(summary, evaluate.score(logits))
    # Scored batch by batch as the run did: every value, class-wise ECE too.
    assert evaluate.score(logits, batch_size=64) == summary
