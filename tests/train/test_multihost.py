"""Multi-host training: 2 processes x 2 CPU devices == 1 process x 4 devices.

The two processes talk through ``jax.distributed`` (gloo collectives) on
127.0.0.1, exactly as hosts of a pod do; each reads only its half of every
global batch. A third process trains the same config on one host with 4
devices. All three run at once, under a timeout: a process whose peer died
aborts (or hangs) rather than raising, so any survivor is killed on failure.
"""

from __future__ import annotations

import json
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import _cli
from _processes import free_port, wait_all
from calib_jax.train import distributed, evaluate

STEPS = 4
OVERRIDES = (
    f"--config.num_steps={STEPS}",
    "--config.batch_size=32",
    "--config.eval_batch_size=64",
    "--config.checkpoint_every=2",
    "--config.log_every=1",
    "--config.dataset.val_split=",
    "--config.shifts.corruptions=none",
)
TIMEOUT_S = 1800


def _start(workdir, *extra, num_devices):
    return subprocess.Popen(
        _cli.command("digits_ce.py", workdir, *OVERRIDES, *extra),
        cwd=_cli.ROOT,
        env=_cli.env(num_devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _final_state(workdir) -> dict:
    """The step-``STEPS`` checkpoint as host numpy arrays (no device layout)."""
    path = workdir / "checkpoints" / str(STEPS) / "state"
    with ocp.PyTreeCheckpointer() as ckpt:
        tree = ckpt.metadata(path).item_metadata.tree
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return ckpt.restore(path, restore_args=args)


def _rows(workdir) -> list[dict]:
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long
def test_two_processes_train_like_one_process_with_the_same_devices(tmp_path):
    multi, single = tmp_path / "multi", tmp_path / "single"
    address = f"127.0.0.1:{free_port()}"
    dist = (
        f"--coordinator_address={address}",
        "--num_processes=2",
        "--distributed_timeout=600",
    )
    procs = [_start(multi, *dist, f"--process_id={i}", num_devices=2) for i in range(2)]
    procs.append(_start(single, num_devices=4))
    results = wait_all(procs, TIMEOUT_S)
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    # Only process 0 prints the summary and writes metrics.
    # (gloo prints its connection lines to stdout on every process.)
    assert "test/ece" in results[0][1] and "test/" not in results[1][1]

    a, b = _rows(multi), _rows(single)
    assert [r["step"] for r in a] == [r["step"] for r in b]  # one row per step
    # The gradient all-reduce crosses processes (gloo) in one run and stays
    # inside one process in the other: float32 sums in a different order,
    # about 1 ulp per step. Hence the house CPU float32 tolerance, not equality.
    # Wrong data sharding (both processes reading the same rows) or a
    # per-process mean would differ at 1e-2 and more.
    tol = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        [r["loss/total"] for r in a if "loss/total" in r],
        [r["loss/total"] for r in b if "loss/total" in r],
        **tol,
    )
    sa, sb = _final_state(multi), _final_state(single)
    assert int(sa["step"]) == int(sb["step"]) == STEPS
    leaves_a = jax.tree_util.tree_leaves_with_path(sa["params"])
    leaves_b = jax.tree.leaves(sb["params"])
    assert len(leaves_a) == len(leaves_b) == 6
    for (path, x), y in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(x, y, **tol, err_msg=jax.tree_util.keystr(path))
    # Evaluation statistics are global: the whole test split, from both hosts.
    for key in ("test/accuracy", "test/ece", "test/nll", "test/classwise_ece"):
        np.testing.assert_allclose(a[-1][key], b[-1][key], **tol, err_msg=key)
    # Each process exported its own rows; read back, the whole test split.
    logits, labels = evaluate.read_logits(multi / "logits", ["test"])["test"]
    assert logits.shape == (360, 10) and labels.shape == (360,)
    # Both processes wrote their shards of one checkpoint.
    state_dir = multi / "checkpoints" / str(STEPS) / "state"
    assert {p.name for p in (state_dir / "array_metadatas").iterdir()} == {
        "process_0",
        "process_1",
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_processes=2, process_id=0), "needs --coordinator_address"),
        (
            dict(coordinator_address="127.0.0.1:1234", num_processes=2),
            "needs --process_id",
        ),
        (
            dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2),
            "process_id must be < num_processes",
        ),
        (
            dict(coordinator_address="127.0.0.1:1234", num_processes=0, process_id=0),
            "num_processes must be >= 1",
        ),
        (
            dict(coordinator_address="127.0.0.1", num_processes=2, process_id=0),
            "HOST:PORT",
        ),
        (
            dict(coordinator_address="h:99999", num_processes=2, process_id=0),
            "HOST:PORT",
        ),
        (
            dict(coordinator_address="h:1", num_processes=2, process_id=0, timeout_s=0),
            "timeout must be a positive int",
        ),
    ],
)
def test_bad_distributed_settings_are_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        distributed.maybe_initialize(**kwargs)
    assert "\n" not in str(e.value)
    assert not jax.distributed.is_initialized()


def test_nothing_asked_means_single_process(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.maybe_initialize() is False
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
        distributed.maybe_initialize()
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="needs --coordinator_address, --process_id"):
        distributed.maybe_initialize()
