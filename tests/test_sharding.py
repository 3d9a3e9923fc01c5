"""``sharding.shard_classes`` on the 8 CPU devices of the test session: the
placement it promises (each device's block of rows and classes, the values
unchanged, dtypes kept) and its one-line errors for shapes the mesh does not
divide, checked before anything is placed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from calib_jax.sharding import is_class_sharded, shard_classes

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sharding_worker as worker  # noqa: E402
from _processes import free_port, wait_all  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

N, K = 24, 40
RNG = np.random.default_rng(7)
Z = (3.0 * RNG.standard_normal((N, K))).astype(ml_dtypes.bfloat16)
Y = RNG.integers(0, K, N).astype(np.int32)


def _mesh(shape):
    return Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))


@pytest.mark.parametrize("shape, data_axis", [((1, 8), None), ((2, 4), "data")])
def test_each_device_holds_its_block_of_rows_and_classes(shape, data_axis):
    mesh = _mesh(shape)
    z, y = shard_classes(Z, Y, mesh=mesh, data_axis=data_axis)
    assert z.sharding.spec == P(data_axis, "vocab")
    assert y.sharding.spec == P(data_axis)
    assert z.dtype == Z.dtype and y.dtype == Y.dtype
    rows, cols = N // mesh.shape["data"] if data_axis else N, K // shape[1]
    for shard in z.addressable_shards:
        r, c = shard.index
        assert shard.data.shape == (rows, cols)
        np.testing.assert_array_equal(np.asarray(shard.data), Z[r, c])
    for shard in y.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), Y[shard.index])
    np.testing.assert_array_equal(np.asarray(z), Z)
    assert is_class_sharded(z) and not is_class_sharded(y)
    # A placed jax.Array is resharded the same way; without labels, x alone.
    again = shard_classes(jax.numpy.asarray(Z), mesh=_mesh((8, 1)), data_axis="data")
    assert again.sharding.spec == P("data", "vocab")
    assert not is_class_sharded(again)
    np.testing.assert_array_equal(np.asarray(again), Z)


def test_is_class_sharded_is_false_off_a_split_class_axis():
    assert not is_class_sharded(Z)  # NumPy
    assert not is_class_sharded(jax.numpy.asarray(Z))  # one device
    seen = []
    jax.jit(lambda z: seen.append(is_class_sharded(z)) or z)(
        shard_classes(Z, mesh=_mesh((1, 8)))
    )
    assert seen == [False]  # a tracer's placement is not visible


BAD = {
    "k_indivisible": (
        lambda: shard_classes(Z[:, :30], Y, mesh=_mesh((1, 8))),
        ValueError,
        "x has K = 30 classes, not divisible by the 8 devices of mesh axis "
        "'vocab' (class_axis): expected K a multiple of 8; the classes are not "
        "padded",
    ),
    "n_indivisible": (
        lambda: shard_classes(Z[:21], Y[:21], mesh=_mesh((2, 4)), data_axis="data"),
        ValueError,
        "x has N = 21 rows, not divisible by the 2 devices of mesh axis 'data' "
        "(data_axis): expected N a multiple of 2",
    ),
    "class_axis_unknown": (
        lambda: shard_classes(Z, mesh=_mesh((1, 8)), class_axis="model"),
        ValueError,
        "class_axis='model' is not an axis of the mesh; expected one of its "
        "axis names ('data', 'vocab').",
    ),
    "data_axis_unknown": (
        lambda: shard_classes(Z, mesh=_mesh((2, 4)), data_axis="batch"),
        ValueError,
        "data_axis='batch' is not an axis of the mesh; expected one of its "
        "axis names ('data', 'vocab').",
    ),
    "data_axis_is_class_axis": (
        lambda: shard_classes(Z, mesh=_mesh((1, 8)), data_axis="vocab"),
        ValueError,
        "data_axis='vocab' is also the class_axis",
    ),
    "x_1d": (
        lambda: shard_classes(Z[0], mesh=_mesh((1, 8))),
        ValueError,
        "x must be 2-D [N, K] (rows by classes), got shape (40,).",
    ),
    "labels_length": (
        lambda: shard_classes(Z, Y[:20], mesh=_mesh((1, 8))),
        ValueError,
        "labels must have shape [N] = (24,), one per row of x, got shape (20,).",
    ),
    "x_int": (
        lambda: shard_classes(Y.reshape(3, 8), mesh=_mesh((1, 8))),
        TypeError,
        "x must be floating point logits or probabilities, got dtype int32.",
    ),
    "mesh_type": (
        lambda: shard_classes(Z, mesh=jax.devices()),
        TypeError,
        "mesh must be a jax.sharding.Mesh, got list.",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_shapes_are_one_line_before_anything_is_placed(case):
    call, kind, message = BAD[case]
    with pytest.raises(kind) as err:
        call()
    text = str(err.value)
    assert "\n" not in text and message in text, text


@pytest.mark.long
def test_two_processes_fill_their_own_devices_from_the_same_host_array(tmp_path):
    """2 CPU processes of 2 devices each: the class axis across both
    processes (1 x 4) and the rows across them (2 x 2). Each process holds
    the full host array, and its devices get exactly their blocks; the NLL
    of the placed logits equals the float64 reference, a RAPS predictor's
    sets equal one device's sorted sets off a 1e-6 band around qhat, and a
    class axis that does not divide K is the same one line on both."""
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    script = str(ROOT / "tests" / "_sharding_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), str(port), str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for code, _, stderr in wait_all(procs, 600):
        assert code == 0, stderr[-3000:]
    z, y = worker.case()
    z64 = z.astype(np.float64)
    m = z64.max(1)
    lse = m + np.log(np.exp(z64 - m[:, None]).sum(1))
    want_nll = float(np.mean(lse - z64[np.arange(worker.N), y]))
    reports = [
        json.loads((tmp_path / f"process-{i}.json").read_text()) for i in range(2)
    ]
    for report in reports:
        for name, r in report.items():
            assert r["processes"] == [0, 1], name
            assert r["local_shards"] == 2 and r["blocks"], name
            np.testing.assert_allclose(r["nll"], want_nll, rtol=1e-6)
            assert r["mismatch_off_band"] == 0, (name, r)
            assert 1 < r["size"] < worker.K, (name, r)
            assert r["error"].startswith(
                "x has K = 31 classes, not divisible by the "
            ), r["error"]
    assert reports[0] == reports[1]
