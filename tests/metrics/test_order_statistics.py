"""Equal-mass 'rank' bins by radix select (large N) against sorting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import metrics
from calib_jax.metrics import _adaptive, _order_statistics


def _sorted_cut_bins(conf, valid, m):
    """float64 NumPy reference of the 'rank' rule: array_split groups of the
    sorted values, every tie in the group of its first occurrence."""
    conf = np.asarray(conf, np.float64)
    keep = np.flatnonzero(valid)
    s = np.sort(conf[keep])
    group = np.empty(len(s), np.int64)
    for g, chunk in enumerate(np.array_split(np.arange(len(s)), m)):
        group[chunk] = g
    first = np.searchsorted(s, conf[keep], side="left")
    out = np.full(len(conf), -1)
    out[keep] = group[first]
    return out


@pytest.mark.long
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [1, 2, 7, 15, 64])
def test_rank_bins_equal_the_sorted_cut(seed, m):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    kind = seed % 3
    if kind == 0:
        conf = rng.random(n)
    elif kind == 1:  # heavy ties, exact 0 and 1
        conf = rng.choice([0.0, 0.2, 0.5, 0.7, 1.0], n)
    else:  # clustered near 1 (trained networks)
        conf = 1.0 - rng.random(n) ** 6 * 0.3
    conf = conf.astype(np.float32)
    valid = rng.random(n) < (0.7 if seed % 2 else 1.0)
    valid[0] = True
    got = np.asarray(
        _order_statistics.rank_bins(jnp.asarray(conf), jnp.asarray(valid), m)
    )
    np.testing.assert_array_equal(got, _sorted_cut_bins(conf, valid, m))


def test_order_statistics_are_the_sorted_values():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)
    bits[:1000] = bits[1000:2000]  # duplicates
    valid = rng.random(5000) < 0.9
    s = np.sort(bits[valid])
    ranks = np.array([0, 1, 17, 17, 2000, len(s) - 2, len(s) - 1], np.int32)
    got = _order_statistics.order_statistics(
        jnp.asarray(bits), jnp.asarray(valid), jnp.asarray(ranks)
    )
    np.testing.assert_array_equal(np.asarray(got), s[ranks])


@pytest.mark.parametrize("p", [1, 2])
def test_adaptive_ece_from_radix_select_matches_float64(p):
    n, k = _adaptive.SELECT_MIN_ROWS + 1234, 10
    rng = np.random.default_rng(3)
    pool = rng.normal(scale=2.0, size=(3000, k))
    pool[:, 0] += 2.0
    logits = pool[rng.integers(0, len(pool), n)]  # rows repeat: tied confidences
    labels = np.where(rng.random(n) < 0.7, 0, rng.integers(0, k, n))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    where = rng.random(n) < 0.9
    conf = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    assert len(np.unique(conf[where])) < where.sum() // 10  # ties are common
    bins = _sorted_cut_bins(conf, where, 15)
    gaps, total = [], where.sum()
    for b in range(15):
        members = bins == b
        if members.any():
            gap = abs(conf[members].astype(np.float64).mean() - correct[members].mean())
            gaps.append((members.sum() / total, gap))
    expected = sum(w * g**p for w, g in gaps) ** (1 / p)
    got = metrics.adaptive_ece(probs, labels, where=where, p=p)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # The same bins through ece(binning='equal_mass').
    same = metrics.ece(probs, labels, where=where, p=p, binning="equal_mass")
    np.testing.assert_allclose(float(same), float(got), rtol=1e-6)


def test_radix_select_path_sharded_equals_single_device():
    n, k = _adaptive.SELECT_MIN_ROWS, 10
    rng = np.random.default_rng(5)
    logits = rng.normal(scale=3.0, size=(n, k))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    labels = rng.integers(0, k, n).astype(np.int32)
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    f = jax.jit(lambda p, y: metrics.adaptive_ece(p, y))
    sharded = f(jax.device_put(probs, rows), jax.device_put(labels, rows))
    single = f(jax.device_put(probs, jax.devices()[0]), labels)
    np.testing.assert_allclose(sharded, single, rtol=1e-6)
