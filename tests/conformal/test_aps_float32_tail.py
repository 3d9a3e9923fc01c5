"""Non-randomised APS when float32 cumulative sums reach 1.0 before the last class.

The documented behaviour (docs/conformal.md, "When the cumulative sum reaches
1.0"): the score along a row's ranking is the float32 cumulative sum; once it
reaches 1.0, every later class scores exactly 1.0 (additions absorbed by
rounding) or just above it (or the sum saturates at 1 - 2**-24, just below
1.0), so at a threshold of exactly 1.0 rounding decides
which tail classes are in the set, and a float64 computation on the same
probabilities decides differently on a share of rows.
"""

import _reference_conformal as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import conformal

ONE = np.float32(1.0)
BELOW_ONE = np.nextafter(ONE, np.float32(0.0))  # 0.99999994


def piled(n=1000, k=10, seed=0):
    """float32 logits of a confident classifier (scale 25: about a third of
    the top probabilities are exactly 1.0 in float32) and labels equal to
    the top class 85% of the time (error 15% > alpha = 0.1)."""
    rng = np.random.default_rng(seed)
    z = (25.0 * rng.standard_normal((n, k))).astype(np.float32)
    top = np.asarray(jnp.argmax(jnp.asarray(z), axis=-1))
    y = np.where(rng.random(n) < 0.85, top, rng.integers(0, k, n))
    return z, y.astype(np.int32)


@pytest.mark.long
def test_a_top_probability_of_one_makes_every_class_score_one():
    z, _ = piled()
    p = np.asarray(jax.nn.softmax(jnp.asarray(z), axis=-1))
    rows = p.max(axis=1) == 1.0
    assert rows.mean() > 0.2
    k = p.shape[1]
    for c in range(k):
        score = np.asarray(conformal.aps_score(p[rows], np.full(rows.sum(), c)))
        np.testing.assert_array_equal(score, ONE)
    # At a threshold of exactly 1.0 such a row's set is every class; one
    # float32 below, it is empty.
    assert np.all(np.asarray(conformal.aps_sets(p[rows], ONE)).sum(axis=1) == k)
    assert np.all(np.asarray(conformal.aps_sets(p[rows], BELOW_ONE)).sum(axis=1) == 0)
    # In float64 the same float32 probabilities sum above 1.0 after the top
    # class unless the tail underflowed to 0: a smaller set.
    exact = (ref.raps_scores(p[rows].astype(np.float64)) <= 1.0).sum(axis=1)
    has_tail = (np.sort(p[rows], axis=1)[:, -2] > 0) & (p[rows].sum(axis=1) > 1.0)
    assert np.all(exact[has_tail] < k)


@pytest.mark.long
def test_the_fitted_threshold_is_exactly_one_and_set_sizes_differ_from_float64():
    z, y = piled()
    pred = conformal.fit("aps", z[:500], y[:500], alpha=0.1)
    # More than alpha of the calibration labels sit in saturated tails.
    assert float(pred.qhat) == 1.0
    sets = np.asarray(pred.predict_sets(z[500:]))
    p = np.asarray(jax.nn.softmax(jnp.asarray(z[500:]), axis=-1))
    # Our sets: exactly the classes whose float32 score is at most 1.0.
    k = p.shape[1]
    scores = np.stack(
        [np.asarray(conformal.aps_score(p, np.full(len(p), c))) for c in range(k)], 1
    )
    np.testing.assert_array_equal(sets, scores <= ONE)
    # A float64 computation on the same float32 probabilities: different
    # sizes on a large share of these rows (measured 0.57 on 2000 rows).
    exact = ref.raps_scores(p.astype(np.float64)) <= 1.0
    differ = sets.sum(axis=1) != exact.sum(axis=1)
    assert differ.mean() > 0.2
    # Only rows whose float32 cumulative sum saturated before the last class
    # differ: at 1.0, or at 1 - 2**-24 (the tail absorbed just below 1.0,
    # where float64 goes on to exceed 1.0).
    saturated = np.sort(scores, axis=1)[:, -2] >= BELOW_ONE
    assert np.all(saturated[differ])
