"""Test configuration: 8 CPU devices, strict rank promotion, no progress bars.

The first two must be set before JAX initialises its backends, hence at import
time of the conftest, which pytest loads before any test module. Progress bars
are off for the session and for the command lines it starts
(``CALIB_JAX_PROGRESS=0``): off a terminal a bar writes a line every so many
seconds, so the lines a command writes would depend on the machine's load. The
tests of the bars turn them on (the ``progress_shown`` fixture).
"""

import itertools
import os

import _gcs
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["CALIB_JAX_PROGRESS"] = "0"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
# Catches [B] vs [B, 1] broadcasting bugs in binning code.
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def progress_shown(monkeypatch):
    """Progress bars on (``CALIB_JAX_PROGRESS=1``) for one test of them."""
    monkeypatch.setenv("CALIB_JAX_PROGRESS", "1")


# ---- A GCS API emulator for gs:// tests (see tests/_gcs.py) -------------------------

_BUCKETS = itertools.count()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """One emulator per test process; its settings are in ``os.environ`` meanwhile,
    so gs:// clients in the test and in its subprocesses reach it."""
    emulator = _gcs.Emulator(tmp_path_factory.mktemp("gcs_emulator"))
    saved = {key: os.environ.get(key) for key in emulator.env}
    os.environ.update(emulator.env)
    try:
        yield emulator
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
    """A new, empty bucket on the emulator, as ``gs://<name>``."""
    name = f"calib-jax-test-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.create_bucket(name)
    return f"gs://{name}"
