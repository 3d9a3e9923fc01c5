"""The conformal quantile (bisection over the float32 order) against
``np.sort`` on scores piled at and just below 1.0, with ties, at every rank."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import conformal
from calib_jax.conformal import _scores

ULP = 2.0**-24  # float32 spacing just below 1.0


def near_one(rng, n):
    """float32 scores: exact 1.0, consecutive floats below it, [0.9999, 1),
    heavy ties and a few anywhere in [0, 1.5] (RAPS scores exceed 1)."""
    pools = [
        np.ones(1),
        1.0 - ULP * np.arange(1, 200),
        rng.uniform(0.9999, 1.0, 300),
        np.array([0.0, 0.5, 0.9999, 1.0 - 2.0**-14]),
        rng.uniform(0.0, 1.5, 300),
    ]
    v = np.concatenate(pools).astype(np.float32)
    kind = rng.choice(len(pools), n, p=[0.25, 0.25, 0.25, 0.15, 0.10])
    lengths = np.array([len(a) for a in pools])
    pick = (np.cumsum(lengths) - lengths)[kind] + rng.integers(0, lengths[kind])
    return v[pick]


@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2, 9, 255, 1000, 1025])
def test_order_statistic_is_the_sorted_value_at_every_rank(n):
    scores = near_one(np.random.default_rng(n), n)
    ranks = sorted({1, 2, n // 2 + 1, n - 1, n} - {0}) if n > 1 else [1]
    want = np.sort(scores)
    x = jnp.asarray(scores)
    for r in ranks:
        assert float(_scores.order_statistic(x, rank=r)) == want[r - 1]


def test_order_statistic_orders_signed_values_and_vmaps():
    x = np.array([3.0, -0.0, 0.0, -np.inf, np.inf, -1e-45, 1e-45, -2.5], np.float32)
    want = np.sort(x)
    for r in range(1, x.size + 1):
        got = float(_scores.order_statistic(jnp.asarray(x), rank=r))
        assert got == want[r - 1]  # -0.0 counts as 0.0
    rng = np.random.default_rng(0)
    batch = np.stack([near_one(rng, 50) for _ in range(4)])
    got = jax.vmap(lambda s: _scores.order_statistic(s, rank=45))(jnp.asarray(batch))
    np.testing.assert_array_equal(np.asarray(got), np.sort(batch, axis=1)[:, 44])


def test_conformal_quantile_near_one_is_the_inverted_cdf_quantile():
    scores = near_one(np.random.default_rng(3), 999)
    r = conformal.quantile_rank(999, 0.1)
    got = float(conformal.conformal_quantile(scores, alpha=0.1))
    assert got == np.quantile(scores, r / 999, method="inverted_cdf")


@pytest.mark.long
@pytest.mark.parametrize("k", [2, 3, 10, 16, 17, 32, 33])
def test_row_sort_network_is_the_sorted_rows(k):
    # Both forms of the APS/RAPS ranking; K = 33 falls back to the sort.
    rng = np.random.default_rng(k)
    probs = near_one(rng, 64 * k).reshape(64, k)
    want = -np.sort(-probs, axis=1)
    for form in (_scores.sort_desc.tuned, _scores.sort_desc.plain):
        np.testing.assert_array_equal(np.asarray(jax.jit(form)(probs)), want)
