"""Properties every loss must have, run over every case of every loss module.

Per case: value against the float64 reference, check_grads (order 1, float64),
jit equals eager, ``where`` equals slicing, bf16 in gives finite float32 out,
finite gradients at extreme logits and for all-correct / all-wrong batches,
no retrace across batches of one shape. Batch-level cases also: invariance to
permuting the batch and global-batch semantics on 8 sharded CPU devices.

The case is a module-scoped parameter (by name), so pytest runs every property
of one case in a row: under ``pytest -n`` they land on the same worker, and the
loss's compiled executables (forward, masked gradient, sliced shapes) are built
once per case rather than once per worker.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.test_util import check_grads

from _harness import random_batch
from cases_batch import CASES as BATCH_CASES
from cases_pointwise import CASES as POINTWISE_CASES

CASES = POINTWISE_CASES + BATCH_CASES
BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES)
ALL = [c.name for c in CASES]
BATCH_ONLY = [c.name for c in CASES if c.batch_level]
DIFFERENTIABLE = [c.name for c in CASES if c.gradient_is_derivative]


def _cases(names):
    """Parametrizes ``name`` over ``names``, grouping the tests by case."""
    return pytest.mark.parametrize("name", names, scope="module")


def _call(case, logits, labels, **kw):
    return case.fn(logits, labels, **case.hparams, **kw)


@pytest.mark.long
@_cases(ALL)
def test_value_matches_float64_reference(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case)
    got = np.asarray(_call(case, logits, labels))
    want = np.asarray(
        case.ref(logits.astype(np.float64), labels, **case.hparams), np.float64
    )
    assert got.dtype == np.float32
    assert got.shape == (() if case.batch_level else (case.batch_size,))
    np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


@pytest.mark.long  # every loss: about 40 s of make test's budget
@_cases(DIFFERENTIABLE)
def test_check_grads_order1(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=1)
    with jax.enable_x64(True):
        x = jnp.asarray(logits, jnp.float64)
        y = jnp.asarray(labels)

        check_grads(
            lambda x: _call(case, x, y),
            (x,),
            order=1,
            modes=("rev",),
            eps=1e-4 if case.smooth else 1e-6,
            atol=case.grad_atol,
            rtol=case.grad_rtol,
        )


@pytest.mark.long
@_cases(ALL)
def test_jit_equals_eager_with_one_trace(name):
    # One jitted function over batches of one shape: equal to eager on each,
    # traced (and compiled) once.
    case = BY_NAME[name]

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(x, y):
        return _call(case, x, y)

    for seed in (2, 10, 11, 12):
        logits, labels = random_batch(case, seed=seed)
        eager = _call(case, logits, labels)
        np.testing.assert_allclose(f(logits, labels), eager, rtol=1e-6, atol=1e-7)
    chex.clear_trace_counter()


@pytest.mark.long
@_cases(ALL)
def test_where_equals_slicing(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=3)
    mask = np.random.default_rng(3).random(case.batch_size) < 0.6
    mask[:2] = True
    # Garbage in the excluded rows must not leak (NaN included).
    dirty = logits.copy()
    dirty[~mask] = np.nan
    masked = np.asarray(_call(case, dirty, labels, where=jnp.asarray(mask)))
    sliced = np.asarray(_call(case, logits[mask], labels[mask]))
    if case.batch_level:
        np.testing.assert_allclose(masked, sliced, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(masked[mask], sliced, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(masked[~mask], 0.0)


@pytest.mark.long
@_cases(ALL)
def test_where_masked_gradients_are_finite_and_zero(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=4)
    mask = np.arange(case.batch_size) % 3 != 0
    dirty = logits.copy()
    dirty[~mask] = 1e4

    def f(x):
        return jnp.sum(_call(case, x, labels, where=jnp.asarray(mask)))

    g = np.asarray(jax.grad(f)(jnp.asarray(dirty)))
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g[~mask], 0.0)


@_cases(ALL)
def test_bf16_input_gives_float32_output(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=5)
    low = jnp.asarray(logits, jnp.bfloat16)
    out = _call(case, low, labels)
    assert out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))
    # Same value as the float32 computation on the bf16-rounded logits.
    want = _call(case, np.asarray(low.astype(jnp.float32)), labels)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)


def _grad_of_sum(case, logits, labels):
    return np.asarray(
        jax.grad(lambda x: jnp.sum(_call(case, x, labels)))(jnp.asarray(logits))
    )


@pytest.mark.long  # every loss: about 40 s of make test's budget
@pytest.mark.parametrize("scale", [1e2, 1e4])
@_cases(ALL)
def test_finite_at_extreme_logits(name, scale):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=6)
    big = np.sign(logits) * scale + logits  # magnitudes up to about +-scale
    out = np.asarray(_call(case, big, labels))
    assert np.all(np.isfinite(out))
    assert np.all(np.isfinite(_grad_of_sum(case, big, labels)))


@pytest.mark.long
@pytest.mark.parametrize("correct", [True, False], ids=["all_correct", "all_wrong"])
@_cases(ALL)
def test_finite_on_all_correct_and_all_wrong(name, correct):
    case = BY_NAME[name]
    logits, _ = random_batch(case, seed=7)
    top = logits.argmax(axis=1)
    labels = top if correct else (top + 1) % case.num_classes
    labels = labels.astype(np.int32)
    for scale in (1.0, 30.0):
        out = np.asarray(_call(case, logits * scale, labels))
        assert np.all(np.isfinite(out))
        assert np.all(np.isfinite(_grad_of_sum(case, logits * scale, labels)))


@_cases(BATCH_ONLY)
def test_batch_level_invariant_to_permutation(name):
    case = BY_NAME[name]
    logits, labels = random_batch(case, seed=8)
    perm = np.random.default_rng(8).permutation(case.batch_size)
    a = _call(case, logits, labels)
    b = _call(case, logits[perm], labels[perm])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.long
@_cases(BATCH_ONLY)
def test_batch_level_global_semantics_on_8_devices(name):
    case = BY_NAME[name]
    assert jax.device_count() == 8
    logits, labels = random_batch(case, seed=9)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data"))
    x = jax.device_put(jnp.asarray(logits), rows)
    y = jax.device_put(jnp.asarray(labels), rows)
    keep = np.arange(case.batch_size) % 5 != 1
    w = jax.device_put(jnp.asarray(keep), rows)
    sharded = jax.jit(lambda x, y, w: _call(case, x, y, where=w))(x, y, w)
    # The whole batch on one device: the eager masked call (the program
    # test_where_equals_slicing compiled; jit equals eager at these
    # tolerances is checked above).
    single = _call(case, logits, labels, where=jnp.asarray(keep))
    assert single.devices() == {jax.devices()[0]}
    np.testing.assert_allclose(sharded, single, rtol=1e-6, atol=1e-7)
