"""The benchmark's persistent compilation cache in a local workdir."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from calib_jax.benchmark import runner


def test_a_local_workdir_holds_the_cache_and_the_settings_are_restored(
    tmp_path, caplog
):
    before = jax.config.jax_compilation_cache_dir
    caplog.set_level(logging.INFO)
    with runner.compilation_cache(epath.Path(tmp_path)):
        assert jax.config.jax_compilation_cache_dir == str(
            tmp_path / runner.COMPILATION_CACHE
        )
        # A program of its own (a constant no other test uses), compiled here.
        out = jax.jit(lambda x: jnp.sin(x) * 1.2345678)(jnp.arange(3.0))
    np.testing.assert_allclose(out, np.sin(np.arange(3.0)) * 1.2345678, rtol=1e-6)
    assert any((tmp_path / runner.COMPILATION_CACHE).iterdir())
    assert jax.config.jax_compilation_cache_dir == before
    # Reopening the cache is not announced on stderr.
    assert not [r for r in caplog.records if "Resetting cache" in r.getMessage()]


def test_a_remote_workdir_leaves_the_cache_alone():
    before = jax.config.jax_compilation_cache_dir
    with runner.compilation_cache(epath.Path("gs://bucket/run")):
        assert jax.config.jax_compilation_cache_dir == before
