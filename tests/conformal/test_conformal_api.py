"""``conformal.fit`` / ``predict_sets``, the set metrics, and bad input."""

import _reference_conformal as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformal._data import synthetic

from calib_jax import conformal

Z, Y = synthetic(600, 8, seed=5, signal=(0.0, 4.0))
ZC, YC, ZT, YT = Z[:300], Y[:300], Z[300:], Y[300:]


def _one_line(err) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


def test_registry_names():
    assert tuple(conformal.PREDICTORS) == ("thr", "aps", "raps")
    assert conformal.get_predictor("raps") is conformal.fit_raps


@pytest.mark.long
@pytest.mark.parametrize("randomized", [False, True])
@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
def test_fit_matches_reference_quantile_and_sets(method, randomized):
    key = jax.random.key(1) if randomized else None
    pred = conformal.fit(method, ZC, YC, alpha=0.1, key=key)
    assert pred.method == method and pred.num_calibration == 300
    assert pred.randomized == (randomized and method != "thr")
    p_cal = ref.softmax(ZC)
    p_test = ref.softmax(ZT)
    u_cal = u_test = None
    pred_key = jax.random.key(2) if pred.randomized else None
    if pred.randomized:  # the uniforms the predictor draws: one per row
        u_cal = np.asarray(jax.random.uniform(key, (300,)), np.float64)
        u_test = np.asarray(jax.random.uniform(pred_key, (300,)), np.float64)
    if method == "thr":
        s_cal, s_test = ref.thr_scores(p_cal), ref.thr_scores(p_test)
    else:
        lam, k_reg = (0.1, 1) if method == "raps" else (0.0, 0)
        s_cal = ref.raps_scores(p_cal, u_cal, lam, k_reg)
        s_test = ref.raps_scores(p_test, u_test, lam, k_reg)
    qhat = ref.quantile(s_cal[np.arange(300), YC], 0.1)
    np.testing.assert_allclose(float(pred.qhat), qhat, rtol=1e-5, atol=2e-6)
    sets = np.asarray(pred.predict_sets(ZT, key=pred_key))
    clear = np.abs(s_test - qhat) > 1e-5
    np.testing.assert_array_equal(sets[clear], (s_test <= qhat)[clear])
    # The predictor's own scores: label in set exactly when score <= qhat.
    scores = pred.scores(ZT, YT, key=pred_key)
    np.testing.assert_array_equal(sets[np.arange(300), YT], scores <= pred.qhat)


@pytest.mark.long
def test_fit_and_predict_under_jit_equal_eager_and_vmap_over_splits():
    key, pkey = jax.random.key(3), jax.random.key(4)

    def run(zc, yc, zt):
        pred = conformal.fit("raps", zc, yc, alpha=0.1, key=key, lam=0.05, k_reg=2)
        return pred.qhat, pred.predict_sets(zt, key=pkey)

    q_eager, s_eager = run(ZC, YC, ZT)
    q_jit, s_jit = jax.jit(run)(ZC, YC, ZT)
    assert float(q_eager) == float(q_jit)
    np.testing.assert_array_equal(s_eager, s_jit)
    # Two splits at once give the two separate fits (to rounding: the batched
    # softmax and cumulative sums may round differently).
    zc = jnp.stack([ZC, ZT])
    yc = jnp.stack([YC, YT])
    q_both, _ = jax.vmap(run, in_axes=(0, 0, None))(zc, yc, ZT)
    assert float(q_both[0]) == pytest.approx(float(q_eager), rel=1e-6)
    assert float(q_both[1]) == pytest.approx(float(run(ZT, YT, ZT)[0]), rel=1e-6)
    # The predictor is a pytree: it passes through jit as an argument.
    pred = conformal.fit("aps", ZC, YC, alpha=0.2)
    f = jax.jit(lambda p, z: p.predict_sets(z))
    np.testing.assert_array_equal(f(pred, ZT), pred.predict_sets(ZT))


def test_randomised_sets_depend_on_the_key_only():
    pred = conformal.fit("aps", ZC, YC, alpha=0.1, key=jax.random.key(0))
    a = pred.predict_sets(ZT, key=jax.random.key(1))
    b = pred.predict_sets(ZT, key=jax.random.key(1))
    c = pred.predict_sets(ZT, key=jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert bool(jnp.any(a != c))


def test_allow_empty_false_adds_the_top_class_to_empty_sets_only():
    key = jax.random.key(0)
    loose = conformal.fit("aps", ZC, YC, alpha=0.3, key=key)
    strict = conformal.fit("aps", ZC, YC, alpha=0.3, key=key, allow_empty=False)
    a = np.asarray(loose.predict_sets(ZT, key=key))
    b = np.asarray(strict.predict_sets(ZT, key=key))
    empty = ~a.any(axis=1)
    assert empty.sum() > 5
    np.testing.assert_array_equal(a[~empty], b[~empty])
    top = np.argmax(ZT, axis=1)
    np.testing.assert_array_equal(b[empty], np.eye(8, dtype=bool)[top[empty]])


def test_bf16_logits_are_upcast():
    pred = conformal.fit("thr", ZC, YC, alpha=0.1)
    half = jnp.asarray(ZT, jnp.bfloat16)
    np.testing.assert_array_equal(
        pred.predict_sets(half),
        pred.predict_sets(np.asarray(half.astype(jnp.float32))),
    )
    assert conformal.fit("aps", half, YT, alpha=0.1).qhat.dtype == jnp.float32


# ---------------------------------------------------------------------------
# Set metrics.
# ---------------------------------------------------------------------------


def _random_sets(n=400, k=30, seed=0):
    rng = np.random.default_rng(seed)
    size = rng.integers(0, k + 1, n)
    order = np.argsort(rng.random((n, k)), axis=1)
    sets = np.zeros((n, k), bool)
    for i in range(n):
        sets[i, order[i, : size[i]]] = True
    return sets, rng.integers(0, k, n).astype(np.int32), rng.random(n) < 0.7


@pytest.mark.long
def test_coverage_and_set_size_match_numpy_and_where_equals_slicing():
    sets, labels, keep = _random_sets()
    hit = sets[np.arange(len(labels)), labels]
    assert float(conformal.coverage(sets, labels)) == pytest.approx(hit.mean())
    assert float(conformal.set_size(sets)) == pytest.approx(sets.sum(1).mean())
    assert float(conformal.coverage(sets, labels, where=keep)) == pytest.approx(
        float(conformal.coverage(sets[keep], labels[keep])), abs=1e-7
    )
    assert float(conformal.set_size(sets, where=keep)) == pytest.approx(
        float(conformal.set_size(sets[keep])), rel=1e-6
    )


@pytest.mark.parametrize(
    "strata",
    [conformal.RAPS_STRATA, ((0, 0), (1, 4), (5, 12), (13, None)), ((3, 7), (0, 30))],
)
@pytest.mark.long
def test_size_stratified_coverage_matches_numpy(strata):
    sets, labels, keep = _random_sets()
    for where in (None, keep):
        cov, cnt = conformal.size_stratified_coverage(
            sets, labels, strata=strata, where=where
        )
        want_cov, want_cnt = ref.stratified_coverage(sets, labels, strata, where)
        np.testing.assert_array_equal(cnt, want_cnt)
        np.testing.assert_allclose(cov, want_cov, rtol=1e-6, equal_nan=True)
    gap = conformal.size_stratified_violation(sets, labels, alpha=0.1, strata=strata)
    want_cov, _ = ref.stratified_coverage(sets, labels, strata)
    assert float(gap) == pytest.approx(np.nanmax(np.abs(want_cov - 0.9)), rel=1e-6)


@pytest.mark.long
def test_size_stratified_coverage_of_real_sets_sums_to_marginal():
    pred = conformal.fit("aps", ZC, YC, alpha=0.1)
    sets = pred.predict_sets(ZT)
    strata = ((0, 1), (2, 3), (4, None))  # a partition of the sizes
    cov, cnt = conformal.size_stratified_coverage(sets, YT, strata=strata)
    assert int(cnt.sum()) == 300
    total = np.nansum(np.asarray(cov) * np.asarray(cnt)) / 300
    assert total == pytest.approx(float(conformal.coverage(sets, YT)), abs=1e-6)


# ---------------------------------------------------------------------------
# Bad input: one line, ValueError (TypeError for a wrong dtype).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kwargs, pattern",
    [
        ("lac", {}, r"unknown conformal method 'lac'; known methods: thr, aps, raps"),
        ("aps", {"alpha": 0.0}, r"alpha must lie in \(0, 1\), got 0.0"),
        ("aps", {"alpha": 1.0}, r"alpha must lie in \(0, 1\), got 1.0"),
        ("thr", {"alpha": -0.1}, r"alpha must lie in \(0, 1\), got -0.1"),
        ("thr", {"alpha": float("nan")}, r"alpha must lie in \(0, 1\), got nan"),
        ("thr", {"alpha": "x"}, r"alpha must be a number in \(0, 1\), got 'x'"),
        ("raps", {"lam": -0.5}, r"lam must be finite and >= 0, got -0.5"),
        ("raps", {"k_reg": -1}, r"k_reg must be >= 0, got -1"),
        ("aps", {"lam": 0.1}, r"unknown option for conformal method 'aps'"),
    ],
)
def test_fit_bad_options_are_one_line(name, kwargs, pattern):
    kwargs = {"alpha": 0.1, **kwargs}
    with pytest.raises(ValueError, match=pattern) as err:
        conformal.fit(name, ZC, YC, **kwargs)
    _one_line(err)


def test_calibration_set_too_small_for_alpha():
    # alpha = 0.1 needs n >= 1/alpha - 1 = 9: 9 rows fit, 8 do not.
    conformal.fit("aps", ZC[:9], YC[:9], alpha=0.1)
    with pytest.raises(
        ValueError, match=r"too small for alpha=0.1: n = 8 < 1/alpha"
    ) as e:
        conformal.fit("aps", ZC[:8], YC[:8], alpha=0.1)
    assert "at least 9 calibration rows" in _one_line(e)
    with pytest.raises(ValueError, match=r"n = 18 < 1/alpha - 1 = 19"):
        conformal.conformal_quantile(np.zeros(18, np.float32), alpha=0.05)


@pytest.mark.parametrize(
    "make, pattern",
    [
        (lambda z, y: (np.where(np.arange(300)[:, None] == 4, np.nan, z), y),
         r"NaN or inf in 1 row\(s\) \(first: row 4\)"),
        (lambda z, y: (z, np.where(np.arange(300) == 2, 8, y)),
         r"labels must lie in \[0, K\) = \[0, 8\); found 8 at row 2"),
        (lambda z, y: (z, y[:-1]), "has 300 rows but labels has 299"),
        (lambda z, y: (z[:, :1], y * 0), "K = 1"),
    ],
)  # fmt: skip
def test_fit_bad_arrays_are_one_line(make, pattern):
    z, y = make(ZC, YC)
    with pytest.raises(ValueError, match=pattern) as err:
        conformal.fit("raps", z.astype(np.float32), y.astype(np.int32), alpha=0.1)
    _one_line(err)


def test_predict_bad_input_is_one_line():
    pred = conformal.fit("aps", ZC, YC, alpha=0.1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="randomised .* needs a PRNG key") as err:
        pred.predict_sets(ZT)
    _one_line(err)
    with pytest.raises(ValueError, match=r"shape \[N, 8\] .* got shape \(300, 7\)"):
        pred.predict_sets(ZT[:, :7], key=jax.random.key(1))
    bad = np.where(np.arange(300)[:, None] == 9, np.inf, ZT).astype(np.float32)
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\) \(first: row 9"):
        pred.predict_sets(bad, key=jax.random.key(1))
    with pytest.raises(TypeError, match="sets must be a bool array"):
        conformal.coverage(np.ones((3, 2), np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="each stratum must be"):
        conformal.size_stratified_coverage(
            np.ones((3, 2), bool), np.zeros(3, np.int32), strata=((3, 1),)
        )
