"""Conformal scores and temperature scaling by NLL with the class axis sharded
over the 8 CPU devices of the test session (issue 23).

bf16 logits ``[N, K]`` sharded ``P(None, 'vocab')`` on a 1 x 8 mesh and
``P('data', 'vocab')`` on a 2 x 4 mesh go through one jitted program: the
float32 softmax, THR's score of the label and its sets, APS's and RAPS's
score of the label in their reduction form (``class_sharded=True``: row sums
of the classes ranked before the label, no sort), and the NLL temperature of
``posthoc.fit('ts:nll')``'s core. Its values equal the one-device program's
(set membership and sizes exactly, sums to 1e-6 relative, the temperature
to 1e-5) and the compiled HLO's collectives move ``O(N)`` values (row
partials), never a block of the ``[N, K]`` array.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import conformal
from calib_jax.conformal import _scores
from calib_jax.posthoc import _temperature
from calib_jax.sharding import shard_classes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from test_vocab_sharded import collectives  # noqa: E402

N, K = 512, 256
LAM, K_REG = 0.02, 3
MESHES = {"1x8": ((1, 8), P(None, "vocab")), "2x4": ((2, 4), P("data", "vocab"))}


def _case():
    """bf16 logits of a trained classifier (a third of the rows confident
    enough for a softmax piled at 1.0; bf16's 8-bit mantissa gives many tied
    logits, so ranks exercise the ties rule), labels and uniforms."""
    rng = np.random.default_rng(5)
    z = 2.5 * rng.standard_normal((N, K))
    labels = rng.integers(0, K, N)
    sure = rng.random(N) < 0.35
    z[sure, labels[sure]] += rng.uniform(12.0, 30.0, sure.sum())
    u = rng.random(N).astype(np.float32)
    return z.astype(ml_dtypes.bfloat16), labels.astype(np.int32), u


# Thresholds of the sets: the APS one between scores (no rounding tie),
# RAPS's at an order statistic (one label score equals it exactly).
Q = {"thr": 0.05, "aps": 0.9, "raps": 0.0}


def _program(z, y, u, q):
    probs = jax.nn.softmax(z.astype(jnp.float32), axis=-1)
    thr = _scores.thr_score(probs, y)
    return {
        "thr": thr,
        "thr_sets": _scores.thr_sets(probs, q["thr"]),
        "aps_sets": _scores.aps_sets(probs, q["aps"], u=u, class_sharded=True),
        "raps_sets": _scores.raps_sets(
            probs, q["raps"], lam=LAM, k_reg=K_REG, class_sharded=True
        ),
        "aps": _scores.aps_score(probs, y, u=u, class_sharded=True),
        "raps": _scores.raps_score(probs, y, lam=LAM, k_reg=K_REG, class_sharded=True),
        "temperature": _temperature.fit_nll(z, y, None, 1e-6, max_iter=100),
    }


_jitted = jax.jit(_program)


def _thresholds():
    """``Q`` with RAPS's set at the 450th smallest reduction-form score."""
    z, y, _ = _case()
    probs = jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1)
    s = conformal.raps_score(probs, y, lam=LAM, k_reg=K_REG, class_sharded=True)
    return {**Q, "raps": np.sort(np.asarray(s))[449]}


@pytest.fixture(scope="module")
def one_device():
    z, y, u = _case()
    dev = jax.devices()[0]
    args = [jax.device_put(a, dev) for a in (z, y, u)]
    q = jax.tree.map(jnp.float32, _thresholds())
    return jax.tree.map(np.asarray, _jitted(*args, q))


def _between(scores, level):
    """A threshold halfway between two distinct order statistics of
    ``scores`` near ``level``: no score lies within rounding of it."""
    s = np.unique(scores.astype(np.float64))
    gaps = np.flatnonzero(np.diff(s) > 1e-5 * np.maximum(1.0, np.abs(s[:-1])))
    i = gaps[np.argmin(np.abs(gaps - level * (s.size - 1)))]
    return (s[i] + s[i + 1]) / 2


@pytest.mark.long
@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_class_sharded_equals_one_device(one_device, mesh_name):
    assert jax.device_count() == 8
    z, y, u = _case()
    shape, spec = MESHES[mesh_name]
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
    zs, ys = shard_classes(z, y, mesh=mesh, data_axis=spec[0])
    assert zs.sharding.spec == spec
    us = jax.device_put(u, NamedSharding(mesh, P(spec[0])))
    q = jax.tree.map(jnp.float32, _thresholds())
    compiled = _jitted.lower(zs, ys, us, q).compile()
    got = jax.tree.map(np.asarray, compiled(zs, ys, us, q))

    # No collective moves a block of rows by classes: row partials only.
    found = collectives(compiled.as_text())
    assert found, "a class-sharded program reduces across devices"
    too_big = [(op, size) for op, size in found if size > 4 * N]
    assert not too_big, too_big
    assert 4 * N * 4 <= N * K // 8  # far below one device's [N, K] block

    # THR: 1 - p_y from a softmax whose row sums add per device (1e-6).
    np.testing.assert_allclose(got["thr"], one_device["thr"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got["thr_sets"], one_device["thr_sets"])
    np.testing.assert_allclose(got["temperature"], one_device["temperature"], rtol=1e-5)
    z32 = np.asarray(z, np.float64)
    p64 = np.exp(z32 - z32.max(1, keepdims=True))
    p64 /= p64.sum(1, keepdims=True)
    p_y = p64[np.arange(N), y]
    # Float64 reference of the ranked scores (ties: the lower index first).
    idx = np.arange(K)[None, :]
    p32 = np.asarray(jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1))
    p32_y = p32[np.arange(N), y][:, None]
    ahead = (p32 > p32_y) | ((p32 == p32_y) & (idx < y[:, None]))
    before = np.where(ahead, p64, 0.0).sum(1)
    rank = ahead.sum(1) + 1
    want = {
        "aps": before + u * p_y,
        "raps": before + p_y + LAM * np.maximum(rank - K_REG, 0),
    }
    for name in ("aps", "raps"):
        np.testing.assert_allclose(got[name], one_device[name], rtol=1e-6)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)
        # The sets' event "label in set": exact, away from rounding of q.
        q = _between(one_device[name], 0.9)
        np.testing.assert_array_equal(got[name] <= q, one_device[name] <= q)
    # The sets by bisection: exactly the one-device sets, sizes too, and the
    # label is in its set exactly when its score is at most the threshold.
    for name, q in (("aps", Q["aps"]), ("raps", _thresholds()["raps"])):
        sets = got[f"{name}_sets"]
        np.testing.assert_array_equal(sets, one_device[f"{name}_sets"])
        np.testing.assert_array_equal(
            sets[np.arange(N), y], one_device[name] <= np.float32(q)
        )
        assert 0 < sets.sum(1).mean() < K


def test_reduction_form_equals_sorted_form():
    """The class-sharding form of APS/RAPS against today's sorted form on
    one device (float32 rounding apart; the label-in-set event exact away
    from the threshold), and bf16 logits through the public functions."""
    z, y, u = _case()
    probs = jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1)
    for kw in ({"u": u, "lam": 0.0, "k_reg": 0}, {"lam": LAM, "k_reg": K_REG}):
        by_sort = np.asarray(conformal.raps_score(probs, y, **kw))
        by_sums = np.asarray(conformal.raps_score(probs, y, class_sharded=True, **kw))
        np.testing.assert_allclose(by_sums, by_sort, rtol=1e-6, atol=1e-7)
        q = _between(by_sort, 0.9)
        np.testing.assert_array_equal(by_sums <= q, by_sort <= q)
    np.testing.assert_array_equal(
        conformal.aps_score(probs, y, u=u, class_sharded=True),
        conformal.raps_score(probs, y, u=u, lam=0.0, k_reg=0, class_sharded=True),
    )


@pytest.mark.long
def test_reduction_sets_equal_sorted_sets():
    """The sets by bisection against the sorted form's, away from a
    cumulative mass that reaches 1.0 in float32 (docs/conformal.md):
    identical, each the top-L classes of the ranking."""
    z, y, u = _case()
    probs = jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1)
    ranking = np.lexsort((np.arange(K)[None, :].repeat(N, 0), -np.asarray(probs)))
    for kw in ({"u": u, "lam": 0.0, "k_reg": 0}, {"lam": LAM, "k_reg": K_REG}):
        scores = np.asarray(conformal.raps_score(probs, y, class_sharded=True, **kw))
        for q in np.quantile(scores, [0.2, 0.8]):
            by_sums = np.asarray(
                conformal.raps_sets(probs, q, class_sharded=True, **kw)
            )
            np.testing.assert_array_equal(by_sums, conformal.raps_sets(probs, q, **kw))
            np.testing.assert_array_equal(
                by_sums[np.arange(N), y], scores <= np.float32(q)
            )
            in_order = np.take_along_axis(by_sums, ranking, axis=1)
            size = in_order.sum(1)
            assert np.all(in_order == (np.arange(K)[None, :] < size[:, None]))
