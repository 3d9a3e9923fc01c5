"""How much memory a computation may use, and a check that a size fits in it.

Sizes that a user chooses (a bin count, the number of classes a fitter's
parameters grow with) can ask for more memory than the device has. XLA then
fails only when it allocates, after compiling and often after minutes of
work, with a ``RESOURCE_EXHAUSTED`` traceback. :func:`check_fits` compares an
estimate with :func:`available_bytes` up front and raises one line instead.

Estimates are Python ints (no int32 overflow) and lower bounds: a size that
fails the check cannot fit; one that passes may still fail later.
"""

from __future__ import annotations

import os

import jax

_UNITS = ("bytes", "kB", "MB", "GB", "TB", "PB", "EB")


def human_bytes(nbytes: float) -> str:
    """``nbytes`` in decimal units, e.g. ``20125000352`` -> ``'20.1 GB'``."""
    value = float(nbytes)
    for unit in _UNITS[:-1]:
        if abs(value) < 1000:
            break
        value /= 1000
    else:
        unit = _UNITS[-1]
    return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def _host_available() -> int | None:
    """The host's available memory: ``MemAvailable`` (Linux), else the
    physical pages free (``os.sysconf``), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def available_bytes(device: jax.Device | None = None) -> int | None:
    """The memory a computation may still use on ``device`` (default: the
    first device of the default backend), or None when it cannot be told.

    On an accelerator this is the allocator's limit minus what is in use
    (``device.memory_stats()``); on the CPU, or when the device reports no
    statistics, the host's available memory.
    """
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - a backend without statistics
            stats = None
        if stats and "bytes_limit" in stats:
            return max(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), 0)
    return _host_available()


def check_fits(
    nbytes: int, what: str, *, fix: str, available: int | None = None
) -> None:
    """Raises a one-line ``ValueError`` when ``nbytes`` cannot fit in memory.

    Args:
      nbytes: the estimated memory the computation needs (a Python int).
      what: what needs it, naming the argument and its value, e.g.
        ``"num_bins=100000000 (the ECE metrics' bins of 2000 rows)"``.
      fix: what the user can do, e.g. ``"lower --num_bins"``.
      available: the memory that may be used (default:
        :func:`available_bytes`); nothing is checked when it is None.

    Raises:
      ValueError: ``"<what> needs about <size>; this device has <size>
        available; <fix>."``.
    """
    if available is None:
        available = available_bytes()
    if available is None or int(nbytes) <= available:
        return
    raise ValueError(
        f"{what} needs about {human_bytes(nbytes)}; this device has "
        f"{human_bytes(available)} available; {fix.rstrip('.')}."
    )
