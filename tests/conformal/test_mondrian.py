"""Class-conditional (Mondrian) conformal: per-class guarantee, references, CovGap."""

import functools

import _reference_conformal as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import conformal

SPLITS = 200


def dirichlet_rows(n: int, k: int, seed: int, *, hard_share: float = 0.0):
    """Probabilities from a fixed Dirichlet generator, labels drawn from them.

    The model is calibrated by construction (``y ~ Categorical(p)``), and a
    uniformly random split of the rows is exchangeable. ``hard_share > 0``
    makes class 0 a hard class: that share of rows is ambiguous (``p ~
    Dirichlet(5, ..., 5)``, near uniform), the others are confident rows
    among classes ``1..K-1`` (``Dirichlet(0.3)`` with ``p_0`` shrunk 100x),
    so class 0 is the label almost only of ambiguous rows, where its
    probability is about ``1/K``. Returns float32 logits ``log p`` and int32
    labels.
    """
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, 0.5), n)
    if hard_share > 0:
        easy = rng.dirichlet(np.full(k, 0.3), n)
        easy[:, 0] *= 0.01
        easy /= easy.sum(axis=1, keepdims=True)
        hard = rng.dirichlet(np.full(k, 5.0), n)
        p = np.where((rng.random(n) < hard_share)[:, None], hard, easy)
    p = np.maximum(p, 1e-30)
    p /= p.sum(axis=1, keepdims=True)
    labels = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    labels = np.minimum(labels, k - 1)
    return np.log(p).astype(np.float32), labels.astype(np.int32)


@functools.partial(jax.jit, static_argnames=("method", "alpha", "n_cal", "options"))
def _per_class(z, y, keys, *, method, alpha, n_cal, options):
    """Per split: class coverage ``[K]`` and calibration class counts ``[K]``."""
    k = z.shape[1]

    def one(key):
        perm = jax.random.permutation(key, z.shape[0])
        cal, test = perm[:n_cal], perm[n_cal:]
        pred = conformal.fit(method, z[cal], y[cal], alpha=alpha, **dict(options))
        sets = pred.predict_sets(z[test])
        counts = jnp.zeros((k,), jnp.int32).at[y[cal]].add(1)
        return conformal.classwise_coverage(sets, y[test]), counts

    return jax.vmap(one)(keys)


def _splits(method, z, y, *, alpha, n_cal, options=()):
    keys = jax.random.split(jax.random.key(11), SPLITS)
    cov, counts = _per_class(
        jnp.asarray(z),
        jnp.asarray(y),
        keys,
        method=method,
        alpha=alpha,
        n_cal=n_cal,
        options=options,
    )
    return np.asarray(cov, np.float64), np.asarray(counts)


ON = (("mondrian", True),)
MONDRIAN = {
    "thr": ON,
    "aps": ON,
    "raps": (("lam", 0.05), ("k_reg", 1), *ON),
}


@pytest.mark.long
@pytest.mark.parametrize("method", sorted(MONDRIAN))
def test_per_class_coverage_over_200_vmapped_splits_meets_the_guarantee(method):
    alpha, n_cal = 0.1, 500
    z, y = dirichlet_rows(1000, 5, seed=0)
    cov, counts = _splits(
        method, z, y, alpha=alpha, n_cal=n_cal, options=MONDRIAN[method]
    )
    assert counts.min() >= 9  # every class has enough rows in every split
    mean = cov.mean(axis=0)
    # Monte-Carlo tolerance: 3 standard errors of the mean over the 200
    # splits (a normal approximation; the per-split coverages are bounded
    # and nearly independent, so a 3-SE miss has probability about 0.3%
    # per class).
    se = cov.std(axis=0, ddof=1) / np.sqrt(SPLITS)
    lower = 1 - alpha
    upper = 1 - alpha + (1.0 / (counts + 1)).mean(axis=0)
    assert np.all(mean >= lower - 3 * se), (mean, se)
    assert np.all(mean <= upper + 3 * se), (mean, se, upper)
    # Sharper, for tie-free scores: given the class counts, the expected
    # coverage of class y is r(n_y) / (n_y + 1) exactly.
    exact = np.vectorize(lambda m: ref.rank(m, alpha) / (m + 1))(counts).mean(axis=0)
    assert np.all(np.abs(mean - exact) <= 3 * se), (mean, exact, se)


@pytest.mark.long
def test_marginal_under_covers_the_hard_class_and_mondrian_does_not():
    alpha, n_cal = 0.1, 1000
    z, y = dirichlet_rows(2000, 4, seed=3, hard_share=0.3)
    marginal, _ = _splits("thr", z, y, alpha=alpha, n_cal=n_cal)
    mondrian, counts = _splits("thr", z, y, alpha=alpha, n_cal=n_cal, options=ON)
    assert counts.min() >= 9
    for cov in (marginal, mondrian):
        assert not np.isnan(cov).any()
    se_m = marginal.std(axis=0, ddof=1) / np.sqrt(SPLITS)
    se_c = mondrian.std(axis=0, ddof=1) / np.sqrt(SPLITS)
    # The marginal predictor covers 90% on average but misses class 0 (the
    # class of the ambiguous rows) by far more than its Monte-Carlo error...
    assert marginal[:, 0].mean() < 1 - alpha - 0.1
    assert marginal[:, 0].mean() + 3 * se_m[0] < 1 - alpha
    # ...and the Mondrian predictor covers every class.
    assert np.all(mondrian.mean(axis=0) >= 1 - alpha - 3 * se_c)


def _numpy_class_quantiles(scores, labels, k, alpha):
    out = np.full(k, np.inf)
    for c in range(k):
        s = np.sort(scores[labels == c])
        r = ref.rank(s.size, alpha)
        if r <= s.size:
            out[c] = s[r - 1]
    return out


@pytest.mark.parametrize("alpha", [0.1, 0.2])
@pytest.mark.parametrize("method", sorted(MONDRIAN))
def test_per_class_quantile_equals_a_float64_numpy_reference(method, alpha):
    z, y = dirichlet_rows(600, 6, seed=1)
    options = dict(MONDRIAN[method])
    pred = conformal.fit(method, z, y, alpha=alpha, **options)
    p = ref.softmax(z)
    if method == "thr":
        every = ref.thr_scores(p)
    else:
        every = ref.raps_scores(
            p, lam=options.get("lam", 0.0), k_reg=options.get("k_reg", 0)
        )
    scores = every[np.arange(len(y)), y]
    want = _numpy_class_quantiles(scores, y, 6, alpha)
    np.testing.assert_allclose(
        np.asarray(pred.qhat, np.float64), want, rtol=0, atol=2e-6
    )
    np.testing.assert_array_equal(
        np.asarray(pred.class_counts), np.bincount(y, minlength=6)
    )
    # The sets are the classes whose float64 score is at most their class's
    # threshold (up to float32 rounding of scores within 2e-6 of it).
    sets = np.asarray(pred.predict_sets(z))
    close = np.abs(every - want[None, :]) < 2e-6
    np.testing.assert_array_equal(sets[~close], (every <= want[None, :])[~close])


@pytest.mark.long
@pytest.mark.parametrize("method", ["aps", "raps"])
def test_label_in_set_exactly_when_score_at_most_its_class_threshold(method):
    # Rounded logits: many tied probabilities, the ranking's tie rule matters.
    z, y = dirichlet_rows(400, 5, seed=2)
    z = np.round(z)
    key = jax.random.key(5)
    for k in (None, key):
        pred = conformal.fit(method, z, y, alpha=0.2, key=k, mondrian=True)
        sets = pred.predict_sets(z, key=k)
        scores = pred.scores(z, y, key=k)
        inside = np.asarray(sets)[np.arange(len(y)), y]
        np.testing.assert_array_equal(inside, np.asarray(scores <= pred.qhat[y]))
        if k is not None:
            continue
        # Every class, not only the label: each class in turn as the label.
        for c in range(5):
            yc = np.full_like(y, c)
            np.testing.assert_array_equal(
                np.asarray(sets)[:, c],
                np.asarray(pred.scores(z, yc, key=k) <= pred.qhat[c]),
            )


def test_absent_fallbacks():
    z, y = dirichlet_rows(300, 4, seed=4)
    y = np.where(y == 2, 1, y)  # class 2 absent
    with pytest.raises(ValueError, match=r"class 2 is absent .*alpha=0\.1"):
        conformal.fit("aps", z, y, alpha=0.1, mondrian=True)
    marginal = conformal.fit("aps", z, y, alpha=0.1)
    fallback = conformal.fit("aps", z, y, alpha=0.1, mondrian=True, absent="marginal")
    full = conformal.fit("aps", z, y, alpha=0.1, mondrian=True, absent="full")
    assert float(fallback.qhat[2]) == float(marginal.qhat)
    assert np.isinf(float(full.qhat[2]))
    assert bool(jnp.all(full.predict_sets(z)[:, 2]))
    present = np.array([0, 1, 3])
    np.testing.assert_array_equal(fallback.qhat[present], full.qhat[present])
    # absent without mondrian=True is an error, not silently ignored.
    with pytest.raises(ValueError, match="mondrian=True"):
        conformal.fit("aps", z, y, alpha=0.1, absent="full")
    # Too few rows (1 < 1/alpha - 1 = 9) is the same error, naming the count.
    y1 = y.copy()
    y1[0] = 2
    with pytest.raises(ValueError, match=r"class 2 has 1 row\(s\) in the calibration"):
        conformal.fit("thr", z, y1, alpha=0.1, mondrian=True)
    # Under jit the labels are traced: 'error' falls back to 'full'.
    jitted = jax.jit(
        lambda a, b: conformal.fit("aps", a, b, alpha=0.1, mondrian=True).qhat
    )
    np.testing.assert_array_equal(jitted(z, y), full.qhat)


def test_mondrian_with_one_class_is_the_marginal_predictor():
    # All rows of one class: the per-class quantile is the marginal one.
    z, _ = dirichlet_rows(200, 3, seed=6)
    y = np.zeros(200, np.int32)
    for m in ("thr", "aps", "raps"):
        marginal = conformal.fit(m, z, y, alpha=0.1)
        mondrian = conformal.fit(m, z, y, alpha=0.1, mondrian=True, absent="full")
        assert float(mondrian.qhat[0]) == float(marginal.qhat)


def test_classwise_coverage_and_coverage_gap_against_float64_formulas():
    rng = np.random.default_rng(0)
    n, k, alpha = 300, 7, 0.1
    sets = rng.random((n, k)) < 0.6
    labels = rng.integers(0, k - 1, n)  # class k-1 has no rows
    where = rng.random(n) < 0.8
    covered = sets[np.arange(n), labels]
    want = np.array(
        [
            covered[(labels == c) & where].mean()
            if ((labels == c) & where).any()
            else np.nan
            for c in range(k)
        ]
    )
    got = conformal.classwise_coverage(sets, labels, k, where=where)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6)
    present = ~np.isnan(want)
    gap = np.abs(want[present] - (1 - alpha)).mean()
    assert (
        abs(float(conformal.coverage_gap(sets, labels, alpha=alpha, where=where)) - gap)
        < 1e-6
    )
    # where equals slicing; jit equals eager.
    sliced = conformal.coverage_gap(sets[where], labels[where], alpha=alpha)
    assert abs(float(sliced) - gap) < 1e-6
    jitted = jax.jit(lambda s, y: conformal.coverage_gap(s, y, alpha=alpha))
    assert (
        abs(
            float(jitted(sets, labels))
            - float(conformal.coverage_gap(sets, labels, alpha=alpha))
        )
        < 1e-7
    )
    # Mergeable: sums of two chunks give the whole.
    h1, c1 = conformal.classwise_coverage_stats(sets[:100], labels[:100])
    h2, c2 = conformal.classwise_coverage_stats(sets[100:], labels[100:])
    hits, counts = conformal.classwise_coverage_stats(sets, labels)
    np.testing.assert_array_equal(h1 + h2, hits)
    np.testing.assert_array_equal(c1 + c2, counts)
    full = conformal.classwise_coverage(sets, labels)
    np.testing.assert_allclose(full[:-1], (hits / counts)[:-1])
    assert np.isnan(float(full[-1]))
