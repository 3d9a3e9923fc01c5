"""The one-axis ``"data"`` mesh over every device of every process."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "data"


def data_mesh() -> Mesh:
    """A 1-D mesh of all devices (all processes) with the axis ``"data"``.

    Built with ``Mesh`` (Auto axis type) rather than ``jax.make_mesh``, whose
    Explicit axes would put the sharding into every array's type.
    """
    return Mesh(np.asarray(jax.devices()), (AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``"data"``."""
    return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over the mesh."""
    return NamedSharding(mesh, P())


def check_batch_size(batch_size: int, mesh: Mesh, what: str = "batch_size") -> None:
    """Raises ValueError unless ``batch_size`` splits evenly over devices and processes."""
    n = mesh.devices.size
    if batch_size % n or batch_size % jax.process_count():
        raise ValueError(
            f"{what}={batch_size} is not divisible by the {n} devices of the mesh "
            f"({jax.process_count()} process(es)); use a multiple of {n}."
        )


def put_batch(local_batch: dict, sharding: NamedSharding) -> dict:
    """Assembles each process's slice of the global batch into global arrays."""
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }
