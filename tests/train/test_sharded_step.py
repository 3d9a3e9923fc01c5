"""The trainer's sharded step built without data, and what it sends between devices.

The collective checks read the HLO of the step as compiled for the 8-device
CPU mesh (the same SPMD partitioner as on TPU): batch-level calibration losses
must reduce O(bins) or O(K) values across devices, never gather the batch.
"""

import dataclasses
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import tensorflow_datasets as tfds

from calib_jax import data, losses
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import setup, sharded_step
from configs import cifar10_resnet110, common

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


@pytest.mark.long
def test_setup_build_runs_the_builders_step_on_the_batches_it_compiles_for(
    monkeypatch, tmp_path
):
    # CIFAR through the trainer's own host pipeline (mock TFDS records): the
    # batches it feeds the step match the abstract batch that ahead-of-time
    # compilation lowers for, in shape, dtype and sharding.
    built, fed = [], []

    def spy(*args, **kwargs):
        steps = original(*args, **kwargs)
        jitted = steps.train

        def train(state, batch):
            fed.append(batch)
            return jitted(state, batch)

        built.append(dataclasses.replace(steps, train=train))
        return built[-1]

    original = sharded_step.build_sharded_step
    monkeypatch.setattr(sharded_step, "build_sharded_step", spy)
    config = cifar10_resnet110.get_config("objective=sb_ece")
    config.model.name = "cnn"
    config.dataset.data_dir = str(tmp_path / "data")
    config.num_steps, config.batch_size = 2, 16
    with tfds.testing.mock_data(
        num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        run = setup.build(config, tmp_path / "run")
        state, _ = run.step(run.init_state(), 0)
    assert len(built) == 1 and len(fed) == 1
    assert run.abstract_state is built[0].abstract_state
    assert int(state.step) == 1
    for leaf, spec in zip(
        jax.tree.leaves(state), jax.tree.leaves(run.abstract_state), strict=True
    ):
        assert (leaf.shape, leaf.dtype, leaf.sharding) == (
            spec.shape,
            spec.dtype,
            spec.sharding,
        )
    for key, spec in built[0].abstract_batch.items():
        real = fed[0][key]
        assert (real.shape, real.dtype) == (spec.shape, spec.dtype), key
        assert real.sharding.is_equivalent_to(spec.sharding, real.ndim), key


@pytest.mark.long
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


@pytest.mark.long
def test_pairwise_and_sorted_losses_exchange_one_scalar_per_example():
    # MMCE's kernel pairs every two examples and AURC sorts the batch, so each
    # needs every example's score: one scalar per example, never the logits.
    terms = [{"name": "cross_entropy"}, {"name": "mmce"}, {"name": "aurc"}]
    found, _ = _collectives(terms)
    batch = mesh_lib.data_mesh().devices.size * ROWS
    scaled = _per_example(found)
    assert {dtype for _, dtype, _ in scaled} == {"f32", "s32"}  # MMCE's, AURC's
    assert all(dims == (batch,) for _, _, dims in scaled), scaled


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
