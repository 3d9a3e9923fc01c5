r"""Placing scores ``[N, K]`` and labels ``[N]`` on a mesh with the class axis
sharded (issue 23).

``shard_classes(x, labels, mesh=mesh)`` puts logits or probabilities on a
user's mesh with the classes split over one mesh axis (``'vocab'`` by
default) and, optionally, the rows over another (``data_axis``), the layout
under which the metrics, the NLL temperature fit and the conformal
predictors work per shard and reduce ``O(N)`` or ``O(K)`` values across
devices (docs/large_label_spaces.md, "Placing the arrays on a mesh"). It
checks the shapes against the mesh first and raises one-line
``ValueError``\ s naming the argument, what it found and what was expected,
where ``jax.device_put`` would raise JAX's own error about an indivisible
dimension. It never pads: a class axis that the mesh axis does not divide is
an error, since padded classes would enter every class-wise statistic.

``is_class_sharded(x)`` says whether an array's class axis is split over
more than one device (the test the conformal predictors use to choose their
row-sum form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def is_class_sharded(x) -> bool:
    """True when ``x`` is a concrete ``jax.Array`` of rank >= 2 whose last
    (class) axis is split over more than one device.

    Tracers, NumPy arrays and arrays whose class axis is whole on every
    device (replicated, row-sharded or on one device) give False.
    """
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return False
    if x.ndim < 2:
        return False
    return x.sharding.shard_shape(x.shape)[-1] < x.shape[-1]


def _axis_size(mesh: Mesh, name: str, option: str) -> int:
    if not isinstance(name, str) or name not in mesh.axis_names:
        axes = ", ".join(repr(a) for a in mesh.axis_names)
        raise ValueError(
            f"{option}={name!r} is not an axis of the mesh; expected one of its "
            f"axis names ({axes})."
        )
    return int(mesh.shape[name])


def _check(x, labels, mesh, class_axis, data_axis):
    """``(rows, classes)`` of ``x`` after the shape checks against ``mesh``."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    shape = tuple(np.shape(x))
    if len(shape) != 2:
        raise ValueError(f"x must be 2-D [N, K] (rows by classes), got shape {shape}.")
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"x must be floating point logits or probabilities, got dtype {dtype}."
        )
    n, k = shape
    v = _axis_size(mesh, class_axis, "class_axis")
    if data_axis is not None:
        d = _axis_size(mesh, data_axis, "data_axis")
        if data_axis == class_axis:
            raise ValueError(
                f"data_axis={data_axis!r} is also the class_axis; expected "
                "another mesh axis (or None: rows not split)."
            )
        if n % d:
            raise ValueError(
                f"x has N = {n} rows, not divisible by the {d} devices of mesh "
                f"axis {data_axis!r} (data_axis): expected N a multiple of {d}; "
                "the rows are not padded (pad them and mask the padding with "
                "where=, or use data_axis=None)."
            )
    if k % v:
        raise ValueError(
            f"x has K = {k} classes, not divisible by the {v} devices of mesh "
            f"axis {class_axis!r} (class_axis): expected K a multiple of {v}; "
            "the classes are not padded (a padded class would enter the "
            "class-wise statistics), so choose a mesh axis whose size divides K."
        )
    if labels is not None:
        lshape = tuple(np.shape(labels))
        if lshape != (n,):
            raise ValueError(
                f"labels must have shape [N] = ({n},), one per row of x, got "
                f"shape {lshape}."
            )
    return n, k


def _place(a, sharding: NamedSharding) -> jax.Array:
    """``a`` as a global array of ``sharding``: a ``jax.Array`` is moved (or
    resharded) by ``jax.device_put``; a host array is cut per addressable
    device by ``jax.make_array_from_callback``, so on a mesh spanning
    several processes each process fills its own devices from its copy."""
    if isinstance(a, jax.Array):
        return jax.device_put(a, sharding)
    host = np.asarray(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_classes(
    x,
    labels=None,
    *,
    mesh: Mesh,
    class_axis: str = "vocab",
    data_axis: str | None = None,
):
    r"""Places scores ``[N, K]`` (and labels ``[N]``) on ``mesh``, the classes
    split over ``class_axis`` and the rows over ``data_axis``.

    ``x`` is placed ``P(data_axis, class_axis)`` and ``labels``
    ``P(data_axis)`` (replicated over the class axis). Under ``jax.jit`` the
    metrics, ``posthoc.fit('ts:nll')``'s core and the conformal predictors
    then reduce each device's classes and move ``O(N)`` or ``O(K)`` values
    between devices, never the ``[N, K]`` array. The shapes are checked
    against the mesh first (no value is read).

    Multi-process meshes: a host array (NumPy) is placed with
    ``jax.make_array_from_callback``; every process must then hold the same
    full host ``x`` and ``labels``, and each fills its own devices with
    their slices (nothing crosses between processes). A ``jax.Array`` is
    given to ``jax.device_put`` (moved or resharded on its devices).

    Args:
      x: float ``[N, K]`` logits or probabilities (any float dtype, kept).
      labels: optional int ``[N]``; ``None`` places ``x`` only.
      mesh: a ``jax.sharding.Mesh``.
      class_axis: the mesh axis the classes are split over; its size must
        divide ``K`` (the classes are never padded).
      data_axis: optional mesh axis the rows are split over; its size must
        divide ``N``. ``None``: every device of a class shard holds all rows.

    Returns:
      The placed ``x``, or ``(x, labels)`` when ``labels`` is given.

    Raises:
      ValueError: ``x`` not 2-D, a mesh axis name not in ``mesh``, ``K`` not
        divisible by the size of ``class_axis``, ``N`` not divisible by the
        size of ``data_axis``, ``data_axis == class_axis``, or ``labels``
        not of shape ``[N]``; one line naming the argument, what it found
        and what was expected.
      TypeError: ``mesh`` not a ``Mesh``, ``x`` not floating point.

    Examples:
      >>> import jax, numpy as np
      >>> from jax.sharding import Mesh
      >>> from calib_jax.sharding import shard_classes
      >>> mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "vocab"))
      >>> z, y = shard_classes(np.zeros((4, 6), np.float32), np.zeros(4, np.int32),
      ...                      mesh=mesh, data_axis="data")
      >>> z.shape, y.shape
      ((4, 6), (4,))
    """
    _check(x, labels, mesh, class_axis, data_axis)
    placed = _place(x, NamedSharding(mesh, P(data_axis, class_axis)))
    if labels is None:
        return placed
    return placed, _place(labels, NamedSharding(mesh, P(data_axis)))
