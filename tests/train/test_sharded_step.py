"""The trainer's sharded step built without data, and what it sends between devices.

The collective checks read the HLO of the step as compiled for the 8-device
CPU mesh (the same SPMD partitioner as on TPU): batch-level calibration losses
must reduce O(bins) or O(K) values across devices, never gather the batch.
"""

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import data, losses
from calib_jax.data import pipeline
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import setup, sharded_step
from configs import common, digits_ce

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _tpu

# Rows per device: a prime no parameter or bin dimension is a multiple of, so
# any array with a dimension divisible by it carries per-example data.
ROWS = 97
NUM_BINS = 15
# Batch-level terms whose statistics are sums over examples (O(bins) or O(K)).
SUMMED = ("sb_ece", "s_avuc", "avuc", "avuc_gs", "mdca", "au_pxtau")


def _config(terms, batch):
    c = common.base()
    c.model.kwargs.hidden = (16,)
    c.loss = tuple(terms)
    c.batch_size = batch
    return c


def _collectives(terms):
    """Collectives of the trainer's step at ``8 * ROWS`` rows, and its params."""
    mesh = mesh_lib.data_mesh()
    config = _config(terms, mesh.devices.size * ROWS)
    steps = sharded_step.build_sharded_step(
        config, data.dataset_info("digits"), mesh, 10
    )
    compiled = steps.train.lower(steps.abstract_state, steps.abstract_batch).compile()
    return _tpu.collectives(compiled.as_text()), steps.abstract_state.params


def _per_example(found):
    """The collective arrays that have a dimension scaling with the batch."""
    return [
        (c.op, dtype, dims)
        for c in found
        for dtype, dims in c.shapes
        if any(d % ROWS == 0 for d in dims)
    ]


def test_the_step_builds_from_metadata_and_matches_the_trainers_batch():
    mesh = mesh_lib.data_mesh()
    config = digits_ce.get_config()
    steps = sharded_step.build_sharded_step(
        config, data.dataset_info("digits"), mesh, 10
    )
    # The abstract batch is what the trainer's host pipeline puts on the mesh.
    source = data.get_dataset("digits").source("train")
    local = pipeline.train_batch(source, step=0, batch_size=config.batch_size, seed=0)
    local = dict(local, mask=np.ones(len(local["label"]), bool))
    real = mesh_lib.put_batch(local, mesh_lib.batch_sharding(mesh))
    for key, spec in steps.abstract_batch.items():
        assert (real[key].shape, real[key].dtype) == (spec.shape, spec.dtype), key
        assert real[key].sharding.is_equivalent_to(spec.sharding, real[key].ndim)
    state = steps.init_state()
    for leaf, spec in zip(
        jax.tree.leaves(state), jax.tree.leaves(steps.abstract_state), strict=True
    ):
        assert (leaf.shape, leaf.dtype) == (spec.shape, spec.dtype)
    compiled = steps.train.lower(steps.abstract_state, steps.abstract_batch).compile()
    new_state, metrics = compiled(state, real)
    assert int(new_state.step) == 1
    assert float(metrics["train/count"]) == config.batch_size


def test_setup_build_runs_the_builders_step(monkeypatch, tmp_path):
    built = []
    original = sharded_step.build_sharded_step

    def spy(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(sharded_step, "build_sharded_step", spy)
    config = digits_ce.get_config()
    config.num_steps = 3
    run = setup.build(config, tmp_path / "run")
    assert len(built) == 1
    assert run.abstract_state is built[0].abstract_state
    assert run.init_state is built[0].init_state
    state, _ = run.step(run.init_state(), 0)
    # The step ran through the builder's jit: its cache holds that compilation.
    assert built[0].train._cache_size() == 1
    assert int(state.step) == 1


def test_summed_batch_level_losses_never_gather_the_batch():
    terms = [{"name": "cross_entropy"}] + [{"name": n} for n in SUMMED]
    found, params = _collectives(terms)
    assert _per_example(found) == []
    assert not [c for c in found if c.op in ("all-gather", "all-to-all")]
    # Every all-reduced array is a scalar, a per-bin or per-class vector, or
    # a parameter (the gradient all-reduce, possibly transposed).
    leaves = jax.tree.leaves(params)
    assert all(d % ROWS for p in leaves for d in p.shape)
    allowed = {(), (NUM_BINS,), (10,)} | {tuple(sorted(p.shape)) for p in leaves}
    reduced = {
        tuple(sorted(dims))
        for c in found
        if c.op == "all-reduce"
        for _, dims in c.shapes
    }
    assert reduced <= allowed, reduced - allowed
    # The gradient all-reduce carries every parameter, and nothing bigger.
    biggest = max(math.prod(p.shape) for p in jax.tree.leaves(params))
    assert max(c.largest for c in found) == biggest


@pytest.mark.parametrize("name", ["mmce", "aurc"])
def test_pairwise_and_sorted_losses_exchange_one_scalar_per_example(name):
    # MMCE's kernel pairs every two examples and AURC sorts the batch, so each
    # needs every example's score: one scalar per example, never the logits.
    found, _ = _collectives([{"name": "cross_entropy"}, {"name": name}])
    batch = mesh_lib.data_mesh().devices.size * ROWS
    scaled = _per_example(found)
    assert scaled and all(dims == (batch,) for _, _, dims in scaled), scaled


def test_a_loss_that_gathers_the_batch_is_caught(monkeypatch):
    def gathering(logits, labels, *, where=None):
        # Sorting along the batch axis needs every device's logits.
        del labels
        ranked = jnp.sort(logits, axis=0)
        return jnp.mean(jnp.where(where[:, None], ranked * logits, 0.0))

    monkeypatch.setitem(losses.LOSSES, "gathering", gathering)
    monkeypatch.setattr(losses, "BATCH_LEVEL", losses.BATCH_LEVEL | {"gathering"})
    found, _ = _collectives([{"name": "cross_entropy"}, {"name": "gathering"}])
    batch = mesh_lib.data_mesh().devices.size * ROWS
    assert (batch, 10) in {dims for _, _, dims in _per_example(found)}
