"""Test configuration: 8 CPU devices and strict rank promotion.

Both must be set before JAX initialises its backends, hence at import time of
the conftest, which pytest loads before any test module.
"""

import itertools
import os

import _gcs
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
# Catches [B] vs [B, 1] broadcasting bugs in binning code.
jax.config.update("jax_numpy_rank_promotion", "raise")


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
