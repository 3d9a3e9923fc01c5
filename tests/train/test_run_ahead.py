"""The training loop's bounded run-ahead and its one-program metric sums."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.train import loop, metrics_log

# 100 dependent steps of a data-parallel program with an all-reduce on 8 CPU
# devices, dispatched without waiting: XLA:CPU stops making progress once
# about 40 such programs are in flight and aborts after the terminate timeout.
_CHAIN = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp
    jax.config.update("jax_num_cpu_devices", 8)
    from jax.sharding import NamedSharding, PartitionSpec as P
    from calib_jax.train import loop

    mesh = jax.make_mesh((8,), ("d",))
    x = jax.device_put(jnp.ones((8 * 64, 128)), NamedSharding(mesh, P("d", None)))
    w = jnp.full((128, 128), 1e-3)

    @jax.jit
    def step(w, x):
        g = jnp.einsum(
            "bi,bj->ij", jnp.tanh(x @ w), x, out_sharding=NamedSharding(mesh, P())
        )
        return w - 1e-3 * g / x.shape[0], {"loss": g.sum()}

    run_ahead = loop.RunAhead(int(sys.argv[1]))
    for _ in range(100):
        w, metrics = step(w, x)
        run_ahead.push(metrics)
    print(float(w.sum()))
    """
)


def test_run_ahead_keeps_a_deep_collective_chain_from_stalling_xla_cpu():
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    # A stall is a deadlock: it aborts the process at the terminate timeout
    # however long that is. Both bounds are far above a loaded machine's
    # slowest collective (a second or two), so only a deadlock reaches them.
    env["XLA_FLAGS"] = (
        "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=300"
    )
    result = subprocess.run(
        [sys.executable, "-c", _CHAIN, str(loop.CPU_RUN_AHEAD)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert "may be stuck" not in result.stderr
    assert np.isfinite(float(result.stdout.strip().splitlines()[-1]))


def test_push_waits_for_the_step_limit_steps_back():
    waited = []

    class Output:
        def __init__(self, i):
            self.i = i

        def block_until_ready(self):
            waited.append(self.i)
            return self

    run_ahead = loop.RunAhead(2)
    for i in range(5):
        run_ahead.push(Output(i))
        # After step i: steps up to i - 2 were waited for, the last two were not.
        assert waited == list(range(max(i - 1, 0)))
    unbounded = loop.RunAhead(None)
    for i in range(5):
        unbounded.push(Output(100 + i))
    assert waited == [0, 1, 2]


def test_for_backend_bounds_the_cpu_only():
    assert jax.default_backend() == "cpu"
    assert loop.RunAhead.for_backend().limit == loop.CPU_RUN_AHEAD >= 1


@pytest.mark.parametrize("num_devices", [1, 8])
def test_accumulate_sums_and_counts_each_key_like_float64(num_devices):
    """Interleaved steps log different keys; each keeps its own sum and count."""
    mesh = jax.make_mesh((num_devices,), ("d",), devices=jax.devices()[:num_devices])
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rng = np.random.default_rng(0)
    steps = []
    for i in range(7):
        keys = ("loss/total", "loss/a") if i % 2 else ("loss/total", "loss/b")
        steps.append({k: np.float32(rng.normal()) for k in keys})
    acc = {}
    for values in steps:
        metrics = {
            k: jax.device_put(jnp.float32(v), replicated) for k, v in values.items()
        }
        acc = metrics_log.accumulate(acc, metrics)
    for key in ("loss/total", "loss/a", "loss/b"):
        seen = [s[key] for s in steps if key in s]
        total, count = acc[key]
        assert count == len(seen)
        expected = np.float32(0.0)
        for v in seen:  # float32 additions in step order, as the loop adds
            expected = np.float32(expected + v)
        assert np.asarray(total) == expected
        np.testing.assert_allclose(
            float(total), np.sum(np.float64(seen)), rtol=1e-6, atol=1e-6
        )
