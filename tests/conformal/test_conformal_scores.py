"""Conformity scores, set rules and the quantile against float64 references."""

import _reference_conformal as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformal._data import synthetic

from calib_jax import conformal

RTOL, ATOL = 1e-5, 2e-6  # float32 cumulative sums over K <= 100 classes


def _case(n=300, k=7, seed=0):
    z, y = synthetic(n, k, seed, signal=(0.0, 4.0))
    u = np.random.default_rng(seed + 1).uniform(size=n).astype(np.float32)
    probs = np.asarray(jax.nn.softmax(z, axis=-1))
    return probs, y, u


SCORES = {
    "thr": (
        lambda p, y, u: conformal.thr_score(p, y),
        lambda p, u: ref.thr_scores(p),
    ),
    "aps": (
        lambda p, y, u: conformal.aps_score(p, y),
        lambda p, u: ref.raps_scores(p, ties="paper"),
    ),
    "aps_randomized": (
        lambda p, y, u: conformal.aps_score(p, y, u=u),
        lambda p, u: ref.raps_scores(p, u, ties="paper"),
    ),
    "raps": (
        lambda p, y, u: conformal.raps_score(p, y, lam=0.1, k_reg=1),
        lambda p, u: ref.raps_scores(p, lam=0.1, k_reg=1, ties="paper"),
    ),
    "raps_randomized_k3": (
        lambda p, y, u: conformal.raps_score(p, y, u=u, lam=0.05, k_reg=3),
        lambda p, u: ref.raps_scores(p, u, lam=0.05, k_reg=3, ties="paper"),
    ),
    "raps_k0": (
        lambda p, y, u: conformal.raps_score(p, y, lam=0.2, k_reg=0),
        lambda p, u: ref.raps_scores(p, lam=0.2, k_reg=0, ties="paper"),
    ),
}


@pytest.mark.long
@pytest.mark.parametrize("k", [7, 100])
@pytest.mark.parametrize("name", sorted(SCORES))
def test_scores_match_float64_reference(name, k):
    probs, y, u = _case(k=k)
    ours, theirs = SCORES[name]
    got = np.asarray(ours(probs, y, u))
    want = theirs(probs.astype(np.float64), u)[np.arange(len(y)), y]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


SETS = {
    "thr": (
        lambda p, q, u: conformal.thr_sets(p, q),
        lambda p, u: ref.thr_scores(p),
    ),
    "aps": (
        lambda p, q, u: conformal.aps_sets(p, q),
        lambda p, u: ref.raps_scores(p),
    ),
    "aps_randomized": (
        lambda p, q, u: conformal.aps_sets(p, q, u=u),
        lambda p, u: ref.raps_scores(p, u),
    ),
    "raps": (
        lambda p, q, u: conformal.raps_sets(p, q, lam=0.1, k_reg=2),
        lambda p, u: ref.raps_scores(p, lam=0.1, k_reg=2),
    ),
    "raps_randomized": (
        lambda p, q, u: conformal.raps_sets(p, q, u=u, lam=0.1, k_reg=2),
        lambda p, u: ref.raps_scores(p, u, lam=0.1, k_reg=2),
    ),
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(SETS))
def test_sets_are_the_classes_whose_reference_score_is_below_qhat(name):
    probs, _, u = _case(k=10)
    ours, theirs = SETS[name]
    want_scores = theirs(probs.astype(np.float64), u)
    for q in np.quantile(want_scores, [0.02, 0.3, 0.6, 0.9]):
        got = np.asarray(ours(probs, np.float32(q), u))
        want = want_scores <= q
        # Classes within float32 rounding of the threshold may go either way.
        clear = np.abs(want_scores - q) > 1e-5
        assert got.dtype == bool and got.shape == want.shape
        np.testing.assert_array_equal(got[clear], want[clear])
        assert clear.mean() > 0.99


@pytest.mark.long
@pytest.mark.parametrize("randomized", [False, True])
@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
def test_label_in_set_exactly_when_its_score_is_below_qhat(method, randomized):
    """For every class as the label: the set rule and the score agree bit for bit."""
    probs, _, u = _case(n=200, k=12, seed=3)
    u = u if randomized else None
    kw = {"lam": 0.07, "k_reg": 2} if method == "raps" else {}
    score_fn = {
        "thr": lambda y: conformal.thr_score(probs, y),
        "aps": lambda y: conformal.aps_score(probs, y, u=u),
        "raps": lambda y: conformal.raps_score(probs, y, u=u, **kw),
    }[method]
    sets_fn = {
        "thr": lambda q: conformal.thr_sets(probs, q),
        "aps": lambda q: conformal.aps_sets(probs, q, u=u),
        "raps": lambda q: conformal.raps_sets(probs, q, u=u, **kw),
    }[method]
    for q in (0.3, 0.7, 0.95, 1.2):
        sets = np.asarray(sets_fn(q))
        for c in range(12):
            s = np.asarray(score_fn(np.full(200, c, np.int32)))
            np.testing.assert_array_equal(sets[:, c], s <= np.float32(q))


def test_ties_rank_the_lower_class_index_first():
    probs = np.array(
        [
            [0.25, 0.25, 0.25, 0.25],
            [0.1, 0.4, 0.1, 0.4],
            [0.5, 0.2, 0.2, 0.1],
        ],
        np.float32,
    )
    u = np.array([0.3, 0.6, 0.9], np.float32)
    want = ref.raps_scores(probs.astype(np.float64), u, lam=0.1, k_reg=1)
    for c in range(4):
        y = np.full(3, c, np.int32)
        got = conformal.raps_score(probs, y, u=u, lam=0.1, k_reg=1)
        np.testing.assert_allclose(got, want[:, c], rtol=RTOL, atol=ATOL)
    # Uniform row, non-randomised APS: scores 0.25, 0.5, 0.75, 1 in index order,
    # so qhat = 0.5 keeps exactly the first two classes (a prefix, no scatter).
    sets = np.asarray(conformal.aps_sets(probs, 0.5))
    np.testing.assert_array_equal(sets[0], [True, True, False, False])
    np.testing.assert_array_equal(sets[1], [False, True, False, False])
    np.testing.assert_array_equal(sets[2], [True, False, False, False])
    # Row 2: 0.4 and 0.8 for the tied classes 1 and 3 (1 first); row 3: the
    # tied classes 1 and 2 score 0.7 and 0.9.
    sets = np.asarray(conformal.aps_sets(probs, 0.85))
    np.testing.assert_array_equal(sets[1], [False, True, False, True])
    np.testing.assert_array_equal(sets[2], [True, True, False, False])


@pytest.mark.long
def test_lam_zero_raps_is_aps_bit_for_bit():
    # K = 10 ranks by the CPU sorting network as K = 20 did (K <= 32), at a
    # quarter of its compile time.
    probs, y, u = _case(k=10)
    np.testing.assert_array_equal(
        conformal.raps_score(probs, y, u=u, lam=0.0, k_reg=4),
        conformal.aps_score(probs, y, u=u),
    )
    np.testing.assert_array_equal(
        conformal.raps_sets(probs, 0.8, lam=0.0, k_reg=4),
        conformal.aps_sets(probs, 0.8),
    )


@pytest.mark.parametrize(
    "n, alpha, rank",
    [(99, 0.1, 90), (9, 0.1, 9), (19, 0.05, 19), (9, 0.3, 7), (99, 0.45, 55),
     (1000, 0.1, 901), (1, 0.5, 1)],
)  # fmt: skip
def test_quantile_rank_is_exact(n, alpha, rank):
    assert conformal.quantile_rank(n, alpha) == rank == ref.rank(n, alpha)


def test_conformal_quantile_is_theorder_statistic():
    rng = np.random.default_rng(0)
    for n in (9, 10, 57, 1000):
        s = rng.normal(size=n).astype(np.float32)
        for alpha in (0.1, 0.2, 0.37):
            if n < 1 / alpha - 1:
                continue
            got = float(conformal.conformal_quantile(s, alpha=alpha))
            assert got == ref.quantile(s, alpha)
            # Exactly r of the n scores are <= qhat (no ties).
            assert np.sum(s <= got) == ref.rank(n, alpha)


@pytest.mark.long
def test_jit_equals_eager_and_low_precision_is_upcast():
    probs, y, u = _case(k=10)
    f = jax.jit(lambda p, y, u: conformal.raps_score(p, y, u=u, lam=0.1, k_reg=2))
    np.testing.assert_array_equal(
        f(probs, y, u), conformal.raps_score(probs, y, u=u, lam=0.1, k_reg=2)
    )
    g = jax.jit(lambda p, q, u: conformal.aps_sets(p, q, u=u))
    np.testing.assert_array_equal(g(probs, 0.7, u), conformal.aps_sets(probs, 0.7, u=u))
    half = jnp.asarray(probs, jnp.bfloat16)
    s = conformal.aps_score(half, y)
    assert s.dtype == jnp.float32
    np.testing.assert_array_equal(
        s, conformal.aps_score(np.asarray(half.astype(jnp.float32)), y)
    )
