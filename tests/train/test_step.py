"""The sharded train step: global-batch semantics and the per-device variant."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from calib_jax import losses
from calib_jax.models import MLP
from calib_jax.train import step as step_lib
from calib_jax.train.state import create

TERMS = {
    "ce+sb_ece": [dict(name="cross_entropy"), dict(name="sb_ece", weight=1.0)],
    "ce+au_pxtau": [dict(name="cross_entropy"), dict(name="au_pxtau", weight=1.0)],
}


def _data(steps=5, batch=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, batch, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, size=(steps, batch)).astype(np.int32)
    return x, y


def _run(devices, terms, per_device=False, steps=5):
    mesh = Mesh(np.asarray(devices), ("data",))
    rows, repl = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    model = MLP(hidden=(32,))
    tx = optax.sgd(0.1, momentum=0.9)
    loss = losses.composite(terms)
    if per_device:
        loss = step_lib.per_device(loss, mesh)
    fn = step_lib.make_train_step(step_lib.model_forward(model), loss, tx)
    state = jax.jit(
        lambda r: create(model, tx, r, jnp.zeros((1, 8, 8, 1))), out_shardings=repl
    )(jax.random.key(0))
    step = jax.jit(fn, in_shardings=(repl, rows), out_shardings=(repl, repl))
    xs, ys = _data(steps)
    history = []
    for i in range(steps):
        batch = {
            "image": jax.device_put(xs[i], rows),
            "label": jax.device_put(ys[i], rows),
            "mask": jax.device_put(np.ones(len(ys[i]), bool), rows),
        }
        state, metrics = step(state, batch)
        history.append(float(metrics["loss/total"]))
    return state, np.array(history)


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(TERMS))
def test_eight_devices_equal_one_device_after_five_steps(name):
    assert jax.device_count() == 8
    s8, h8 = _run(jax.devices(), TERMS[name])
    s1, h1 = _run(jax.devices()[:1], TERMS[name])
    np.testing.assert_allclose(h8, h1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s8.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Something was learned: the loss changed over the five steps.
    assert abs(h8[-1] - h8[0]) > 1e-3


@pytest.mark.long
def test_per_device_statistics_differ_from_global_and_match_shard_means():
    terms = [dict(name="sb_ece", weight=1.0)]
    _, glob = _run(jax.devices(), terms, steps=1)
    _, local = _run(jax.devices(), terms, per_device=True, steps=1)
    # Per-device: the mean over the 8 shards of the shard-level SB-ECE.
    model = MLP(hidden=(32,))
    tx = optax.sgd(0.1, momentum=0.9)
    params = create(model, tx, jax.random.key(0), jnp.zeros((1, 8, 8, 1))).params
    xs, ys = _data(1)
    logits = model.apply({"params": params}, xs[0])
    shard = [
        float(losses.sb_ece(logits[i * 4 : (i + 1) * 4], ys[0][i * 4 : (i + 1) * 4]))
        for i in range(8)
    ]
    np.testing.assert_allclose(local[0], np.mean(shard), rtol=1e-5)
    np.testing.assert_allclose(glob[0], float(losses.sb_ece(logits, ys[0])), rtol=1e-5)
    assert abs(local[0] - glob[0]) > 1e-4


def test_extra_hook_sets_the_extra_state_and_adds_its_metrics():
    model = MLP(hidden=(8,))
    tx = optax.sgd(0.1)
    state = jax.jit(lambda r: create(model, tx, r, jnp.zeros((1, 8, 8, 1))))(
        jax.random.key(0)
    )
    state = state.replace(extra={"n": jnp.float32(0.0)})

    def hook(old, logits, labels, mask):
        n = old.extra["n"] + jnp.sum(mask.astype(jnp.float32))
        return {"n": n}, {"hook/n": n, "hook/label_sum": jnp.sum(labels)}

    loss = losses.composite([dict(name="cross_entropy")])
    fwd = step_lib.model_forward(model)
    hooked = step_lib.make_train_step(fwd, loss, tx, extra_hook=hook)
    plain = step_lib.make_train_step(fwd, loss, tx)
    # Both in one compiled call: the step with the hook and without it.
    both = jax.jit(lambda s, p, b: (hooked(s, b), plain(p, b)))
    xs, ys = _data(steps=2, batch=6)
    mask = np.array([1, 1, 1, 1, 0, 0], bool)
    want_state = state.replace(extra={})
    for i in range(2):
        batch = {"image": xs[i], "label": ys[i], "mask": mask}
        (state, metrics), (want_state, want) = both(state, want_state, batch)
        assert float(metrics["hook/n"]) == 4.0 * (i + 1) == float(state.extra["n"])
        assert int(metrics["hook/label_sum"]) == int(ys[i].sum())
        # The hook adds its metrics and changes nothing else.
        assert set(metrics) == set(want) | {"hook/n", "hook/label_sum"}
        for key, value in want.items():
            np.testing.assert_array_equal(metrics[key], value)
        for a, b in zip(
            jax.tree.leaves(state.params), jax.tree.leaves(want_state.params)
        ):
            np.testing.assert_array_equal(a, b)
