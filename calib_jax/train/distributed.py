"""Multi-host start-up: ``jax.distributed`` from command-line flags or the cluster.

One process runs per host. Every process runs the same command; they differ
only in ``--process_id`` (or in what the cluster tells JAX). After
:func:`maybe_initialize`, ``jax.devices()`` lists the devices of *all*
processes, so :func:`calib_jax.train.mesh.data_mesh` spans the pod, and each
process feeds only its own rows (:mod:`calib_jax.data.pipeline`).

Three ways to start, in this order of precedence per value:

* flags ``--coordinator_address=HOST:PORT --num_processes=N --process_id=I``;
* environment variables ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
  ``JAX_PROCESS_ID``;
* ``--distributed=auto``: JAX's own cluster detection (Cloud TPU pods, SLURM,
  Open MPI, Kubernetes) fills whatever is still unset.

With none of these the run is single-process and nothing is initialised.

On CPU, cross-process collectives use gloo, which is the default of
``jax_cpu_collectives_implementation`` in JAX 0.10; no config update is needed.
"""

from __future__ import annotations

import os

from absl import flags

MODES = ("off", "auto")

_DISTRIBUTED = flags.DEFINE_enum(
    "distributed",
    "off",
    MODES,
    "'auto': let JAX detect a TPU pod / SLURM / Open MPI / Kubernetes cluster "
    "for any of --coordinator_address, --num_processes, --process_id not given.",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "HOST:PORT of process 0, the same on every process (multi-host runs).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Number of processes (hosts) in a multi-host run."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's id in [0, num_processes)."
)
_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout",
    300,
    "Seconds to wait for every process to connect to the coordinator.",
)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer.") from None


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"coordinator_address must be HOST:PORT with a port in 1..65535, "
            f"got {address!r}."
        )


def maybe_initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto: bool = False,
    timeout_s: int = 300,
) -> bool:
    """Initialises ``jax.distributed`` when a multi-process run is asked for.

    Must be called before any JAX computation. Values left as ``None`` are
    read from ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``; with ``auto=True`` JAX's cluster detection fills what
    is still missing. Calling it again after a successful initialisation is a
    no-op that returns True.

    Args:
      coordinator_address: ``HOST:PORT`` of process 0 (the same everywhere).
      num_processes: positive int, the number of processes.
      process_id: int in ``[0, num_processes)``.
      auto: use JAX's cluster auto-detection for unset values.
      timeout_s: positive int, seconds to wait for all processes to connect.

    Returns:
      True when the run is distributed (initialised now or before), False
      when nothing was asked for (a single-process run).

    Raises:
      ValueError: one-line message for incomplete or invalid settings, or
        when JAX was already in use.
    """
    import jax  # keep flag definition free of JAX start-up

    if jax.distributed.is_initialized():
        return True
    coordinator_address = coordinator_address or (
        os.environ.get("JAX_COORDINATOR_ADDRESS", "").strip() or None
    )
    if num_processes is None:
        num_processes = _env_int("JAX_NUM_PROCESSES")
    if process_id is None:
        process_id = _env_int("JAX_PROCESS_ID")
    given = (coordinator_address, num_processes, process_id)
    if not auto and all(v is None for v in given):
        return False
    if not isinstance(timeout_s, int) or timeout_s <= 0:
        raise ValueError(
            f"distributed timeout must be a positive int, got {timeout_s!r}."
        )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
    if process_id is not None and process_id < 0:
        raise ValueError(f"process_id must be >= 0, got {process_id}.")
    if None not in (num_processes, process_id) and process_id >= num_processes:
        raise ValueError(
            f"process_id must be < num_processes, got {process_id} and {num_processes}."
        )
    if coordinator_address is not None:
        _check_address(coordinator_address)
    if not auto and None in given:
        missing = [
            name
            for name, v in zip(
                ("coordinator_address", "num_processes", "process_id"), given
            )
            if v is None
        ]
        raise ValueError(
            f"A multi-process run needs --{', --'.join(missing)} as well "
            "(or --distributed=auto on a cluster JAX can detect)."
        )
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            initialization_timeout=timeout_s,
        )
    except (RuntimeError, TypeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if auto and None in given and "defined" in first:
            first = (
                "--distributed=auto found no TPU pod, SLURM, Open MPI or "
                "Kubernetes cluster; pass --coordinator_address, "
                "--num_processes and --process_id"
            )
        raise ValueError(f"jax.distributed could not start: {first}") from None
    return True


def initialize_from_flags() -> bool:
    """:func:`maybe_initialize` with this module's absl flags (after parsing).

    For command-line entry points (``python -m calib_jax.train``, the
    benchmark): importing this module defines the flags ``--distributed``,
    ``--coordinator_address``, ``--num_processes``, ``--process_id`` and
    ``--distributed_timeout``.

    Returns:
      Whether the run is multi-process (see :func:`maybe_initialize`).
    """
    return maybe_initialize(
        _COORDINATOR.value,
        _NUM_PROCESSES.value,
        _PROCESS_ID.value,
        auto=_DISTRIBUTED.value == "auto",
        timeout_s=_TIMEOUT.value,
    )
