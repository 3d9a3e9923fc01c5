"""``sharding.shard_classes`` on the 8 CPU devices of the test session: the
placement it promises (each device's block of rows and classes, the values
unchanged, dtypes kept) and its one-line errors for shapes the mesh does not
divide, checked before anything is placed."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from calib_jax.sharding import is_class_sharded, shard_classes

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
