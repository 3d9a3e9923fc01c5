"""Test configuration: 8 CPU devices and strict rank promotion.

Both must be set before JAX initialises its backends, hence at import time of
the conftest, which pytest loads before any test module.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
# Catches [B] vs [B, 1] broadcasting bugs in binning code.
jax.config.update("jax_numpy_rank_promotion", "raise")
