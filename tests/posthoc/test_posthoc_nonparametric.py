"""Histogram binning and isotonic regression (top-label and one-vs-rest)."""

import _reference_posthoc as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from posthoc._data import overconfident
from sklearn.isotonic import IsotonicRegression

from calib_jax import posthoc
from calib_jax.posthoc import _reduction

VARIANTS = ("top_label", "one_vs_rest")


def tied(n, k, seed, distinct):
    """Logits with many tied rows (``distinct`` different rows) and labels
    drawn per row from softmax(logits / 3), the calibrated probabilities."""
    base, _ = overconfident(distinct, k, seed=seed)
    rng = np.random.default_rng(seed + 100)
    rows = rng.integers(0, distinct, n)
    z = base[rows]
    p = ref.softmax(z / 3.0)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(1).astype(np.int32)
    return z, np.minimum(y, k - 1)


def library_scores(z, variant="one_vs_rest"):
    """The float32 scores the fitters and maps use (as float64): softmax
    probabilities, with the top-label confidence in the predicted column
    for ``'top_label'``. The references consume these."""
    p = np.asarray(_reduction.probabilities(jnp.asarray(z)), np.float64)
    if variant == "top_label":
        pred, conf = (np.asarray(a) for a in _reduction.top_label(jnp.asarray(z)))
        p[np.arange(len(p)), pred] = conf
    return p


def test_library_scores_are_the_softmax():
    z, _ = tied(2000, 5, seed=0, distinct=500)
    pred, conf = _reduction.top_label(jnp.asarray(z))
    np.testing.assert_array_equal(np.asarray(pred), z.argmax(1))
    np.testing.assert_allclose(np.asarray(conf), ref.softmax(z).max(1), rtol=1e-6)
    p = library_scores(z)
    np.testing.assert_allclose(p, ref.softmax(z), rtol=1e-6, atol=1e-12)
    assert (library_scores(z, "top_label").argmax(1) == z.argmax(1)).all()


@pytest.mark.parametrize(
    ("n", "k", "scale"), [(7, 2, 0.1), (4097, 3, 30.0), (3000, 100, 3.0)]
)
@pytest.mark.long
def test_checked_scores_are_bit_equal_to_the_ones_maps_apply(n, k, scale):
    # Fitters read the logits once for scores and value check together; the
    # scores must stay bit-equal to what apply_* computes, or a validation
    # score at a threshold could change bins between fit and apply.
    rng = np.random.default_rng(n)
    z = jnp.asarray((scale * rng.normal(size=(n, k))).astype(np.float32))
    y = jnp.asarray(rng.integers(0, k, n).astype(np.int32))
    where = jnp.asarray(rng.random(n) < 0.5)
    for w in (None, where):
        (pred, conf), _ = _reduction.checked_top_label(z, y, w)
        p, _ = _reduction.checked_probabilities(z, y, w)
        ref_pred, ref_conf = _reduction.top_label(z)
        np.testing.assert_array_equal(np.asarray(pred), np.asarray(ref_pred))
        np.testing.assert_array_equal(np.asarray(conf), np.asarray(ref_conf))
        np.testing.assert_array_equal(
            np.asarray(p), np.asarray(_reduction.probabilities(z))
        )


@pytest.mark.long
@pytest.mark.parametrize("name", ["histogram_binning", "isotonic"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_value_check_names_the_first_bad_row(name, variant):
    z, y = tied(300, 4, seed=3, distinct=100)
    fit = getattr(posthoc, f"fit_{name}")
    bad = z.copy()
    bad[[17, 40], 2] = [np.inf, np.nan]
    with pytest.raises(ValueError, match=r"NaN or inf in 2 row\(s\) \(first: row 17\)"):
        fit(bad, y, variant=variant)
    where = np.ones(300, bool)
    where[17] = False
    with pytest.raises(ValueError, match=r"in 1 row\(s\) \(first: row 40\)"):
        fit(bad, y, where=where, variant=variant)
    bad_y = y.copy()
    bad_y[5] = 4
    with pytest.raises(
        ValueError, match=r"found 4 at row 5 \(1 label\(s\) out of range\)"
    ):
        fit(z, bad_y, variant=variant)
    with pytest.raises(ValueError, match="where excludes every row"):
        fit(z, y, where=np.zeros(300, bool), variant=variant)


# ---------------------------------------------------------------------------
# Histogram binning
# ---------------------------------------------------------------------------


def _hb_fit(num_bins, binning):
    return lambda v, t: ref.histogram_binning_binary(v, t, num_bins, binning)


def _hb_predict(model, v):
    return ref.histogram_binning_predict(*model, v)


@pytest.mark.long
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("binning", ["equal_mass", "equal_width"])
def test_histogram_binning_matches_float64_reference(variant, binning):
    z, y = tied(3000, 5, seed=1, distinct=700)
    zt, _ = tied(1000, 5, seed=2, distinct=700)
    params = posthoc.fit_histogram_binning(
        z, y, variant=variant, num_bins=15, binning=binning
    )
    p, pt = library_scores(z, variant), library_scores(zt, variant)
    reduce = (
        ref.top_label_reduction if variant == "top_label" else ref.one_vs_rest_reduction
    )
    expected = reduce(p, y, pt, _hb_fit(15, binning), _hb_predict)
    got = np.exp(
        np.asarray(posthoc.apply_histogram_binning(params, zt, variant=variant))
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)
    # Thresholds and bin frequencies per class.
    for c in range(5):
        if variant == "top_label":
            sel = p.argmax(1) == c
            v, t = p.max(1)[sel], (y[sel] == c)
        else:
            v, t = p[:, c], y == c
        thr, values = ref.histogram_binning_binary(v, t, 15, binning)
        np.testing.assert_allclose(params["thresholds"][c], thr, rtol=1e-7)
        np.testing.assert_allclose(params["values"][c], values, atol=1e-7)


@pytest.mark.long
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("binning", ["equal_mass", "equal_width"])
def test_histogram_binning_one_bin_is_each_classs_frequency(variant, binning):
    # One bin per class: no thresholds, and the value is the fraction of
    # positives among the class's rows (predicted as it, or all rows).
    z, y = tied(400, 4, seed=3, distinct=90)
    w = np.random.default_rng(4).random(400) > 0.3
    params = posthoc.fit_histogram_binning(
        z, y, where=w, variant=variant, num_bins=1, binning=binning
    )
    p = np.asarray(library_scores(z, variant), np.float64)
    assert params["thresholds"].shape == (4, 0)
    for c in range(4):
        if variant == "top_label":
            sel = w & (p.argmax(1) == c)
        else:
            sel = w
        expected = np.mean(y[sel] == c) if sel.any() else None
        if expected is None:
            assert not params["fitted"][c]
        else:
            np.testing.assert_allclose(params["values"][c, 0], expected, rtol=1e-6)


@pytest.mark.long
def test_histogram_binning_equal_mass_bins_hold_equal_counts_without_ties():
    z, y = overconfident(1500, 3, seed=5, scale=1.0)  # continuous, no ties
    params = posthoc.fit_histogram_binning(z, y, variant="one_vs_rest", num_bins=10)
    p = library_scores(z)
    for c in range(3):
        bins = (p[:, c][:, None] > np.asarray(params["thresholds"][c])[None]).sum(1)
        np.testing.assert_array_equal(np.bincount(bins, minlength=10), 150)


@pytest.mark.long
@pytest.mark.parametrize("k", [2, 10, 1000])
def test_top_label_thresholds_are_the_order_statistics_at_the_extremes(k):
    # Top-label confidences lie in [fl(1/K), 1]; the select runs on keys
    # offset from just below fl(1/K). Rows at both ends (all-equal logits give
    # exactly fl(1/K), a margin of 200 gives 1.0) must still give the exact
    # order statistics np.partition finds.
    rng = np.random.default_rng(k)
    n = 3000
    z = rng.normal(size=(n, k)).astype(np.float32) * 2.0
    z[: n // 5] = 0.0
    z[n // 5 : 2 * n // 5, 0] += 200.0
    y = rng.integers(0, k, n).astype(np.int32)
    y = np.where(rng.random(n) < 0.7, z.argmax(1), y).astype(np.int32)
    params = posthoc.fit_histogram_binning(z, y, num_bins=15)
    pred, conf = (np.asarray(a) for a in _reduction.top_label(jnp.asarray(z)))
    assert conf.min() == np.float32(1.0) / np.float32(k) and conf.max() == 1.0
    for c in np.unique(pred):
        v = np.sort(conf[pred == c])
        m = len(v)
        q, rem = divmod(m, 15)
        starts = [
            j * (q + 1) if j <= rem else rem * (q + 1) + (j - rem) * q
            for j in range(1, 15)
        ]
        want = v[np.clip(np.array(starts) - 1, 0, m - 1)]
        np.testing.assert_array_equal(np.asarray(params["thresholds"][c]), want)


@pytest.mark.long
def test_histogram_binning_where_equals_slicing_and_jit_equals_eager():
    z, y = tied(1200, 4, seed=3, distinct=400)
    keep = np.arange(1200) % 3 != 0
    for variant in VARIANTS:
        a = posthoc.fit_histogram_binning(z, y, variant=variant, where=keep)
        b = posthoc.fit_histogram_binning(z[keep], y[keep], variant=variant)
        for key in a:
            # XLA may round a row's softmax differently for another N (1 ulp).
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)
    jitted = jax.jit(lambda z, y, w: posthoc.fit_histogram_binning(z, y, where=w))
    c = jitted(z, y, keep)
    d = posthoc.fit_histogram_binning(z, y, where=keep)
    for key in d:
        np.testing.assert_array_equal(c[key], d[key])


@pytest.mark.long
def test_histogram_binning_class_never_predicted_keeps_its_confidence():
    z, y = overconfident(800, 4, seed=6)
    z[:, 3] -= 100.0  # class 3 is never the prediction on validation
    params = posthoc.fit_histogram_binning(z, y)
    assert np.asarray(params["fitted"]).tolist() == [True, True, True, False]
    zt = np.array([[0.0, 0.5, 1.0, 3.0]], np.float32)
    out = np.exp(np.asarray(posthoc.apply_histogram_binning(params, zt)))
    np.testing.assert_allclose(out, ref.softmax(zt), rtol=1e-6)


@pytest.mark.long
def test_histogram_binning_many_bins_use_the_binary_search_path():
    z, y = overconfident(4000, 3, seed=7)
    zt, _ = overconfident(500, 3, seed=8)
    params = posthoc.fit_histogram_binning(z, y, variant="one_vs_rest", num_bins=60)
    p, pt = library_scores(z), library_scores(zt)
    expected = ref.one_vs_rest_reduction(
        p, y, pt, _hb_fit(60, "equal_mass"), _hb_predict
    )
    got = np.exp(
        np.asarray(posthoc.apply_histogram_binning(params, zt, variant="one_vs_rest"))
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Isotonic regression
# ---------------------------------------------------------------------------


def _sk_fit(v, t):
    return IsotonicRegression(out_of_bounds="clip").fit(v, t)


def _sk_predict(model, v):
    return model.predict(v)


@pytest.mark.long
@pytest.mark.parametrize("variant", VARIANTS)
def test_isotonic_equals_sklearn_on_ten_thousand_points(variant):
    # 10^4 validation points with ties (4000 distinct rows); scikit-learn fits
    # the same float32 scores.
    z, y = tied(10_000, 4, seed=11, distinct=4000)
    zt, _ = tied(3000, 4, seed=12, distinct=4000)
    zt = np.concatenate([zt, overconfident(1000, 4, seed=13)[0]])  # unseen scores
    params = posthoc.fit_isotonic(z, y, variant=variant)
    p, pt = library_scores(z, variant), library_scores(zt, variant)
    reduce = (
        ref.top_label_reduction if variant == "top_label" else ref.one_vs_rest_reduction
    )
    expected = reduce(p, y, pt, _sk_fit, _sk_predict)
    got = np.exp(
        np.asarray(posthoc.apply_isotonic(params, zt, variant=variant), np.float64)
    )
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # The knots are scikit-learn's thresholds.
    for c in range(4):
        if variant == "top_label":
            sel = p.argmax(1) == c
            model = _sk_fit(p.max(1)[sel], (y[sel] == c).astype(float))
        else:
            model = _sk_fit(p[:, c], (y == c).astype(float))
        m = model.X_thresholds_.size
        x, v = np.asarray(params["x"][c]), np.asarray(params["y"][c])
        np.testing.assert_array_equal(x[:m], model.X_thresholds_)
        np.testing.assert_allclose(v[:m], model.y_thresholds_, atol=1e-7)
        assert (x[m:] == x[m - 1]).all() and (v[m:] == v[m - 1]).all()  # padding


@pytest.mark.long
def test_isotonic_binary_fit_is_monotone_and_pools_ties():
    z, y = tied(5000, 3, seed=14, distinct=300)
    params = posthoc.fit_isotonic(z, y, variant="one_vs_rest")
    assert (np.diff(np.asarray(params["x"]), axis=1) >= 0).all()
    assert (np.diff(np.asarray(params["y"]), axis=1) >= 0).all()
    # Rows with equal logits get equal outputs.
    out = np.asarray(posthoc.apply_isotonic(params, z, variant="one_vs_rest"))
    rows = {}
    for row, o in zip(map(bytes, z), out):
        np.testing.assert_array_equal(rows.setdefault(row, o), o)


@pytest.mark.long
def test_isotonic_where_equals_slicing_and_apply_jits():
    z, y = tied(1500, 4, seed=15, distinct=600)
    keep = np.arange(1500) % 4 != 1
    for variant in VARIANTS:
        a = posthoc.fit_isotonic(z, y, variant=variant, where=keep)
        b = posthoc.fit_isotonic(z[keep], y[keep], variant=variant)
        for key in a:
            # XLA may round a row's softmax differently for another N (1 ulp).
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)
        eager = np.exp(np.asarray(posthoc.apply_isotonic(a, z, variant=variant)))
        jitted = jax.jit(
            lambda p, x, v=variant: posthoc.apply_isotonic(p, x, variant=v)
        )
        # 1-ulp differences of the scores, times the slope between knots.
        np.testing.assert_allclose(eager, np.exp(jitted(a, z)), atol=1e-6)


@pytest.mark.long
def test_isotonic_class_never_predicted_gets_the_identity():
    z, y = overconfident(800, 4, seed=16)
    z[:, 0] -= 100.0
    params = posthoc.fit_isotonic(z, y)
    np.testing.assert_array_equal(params["x"][0, :2], [0.0, 1.0])
    zt = np.array([[3.0, 0.5, 1.0, 0.0]], np.float32)
    out = np.exp(np.asarray(posthoc.apply_isotonic(params, zt)))
    np.testing.assert_allclose(out, ref.softmax(zt), rtol=1e-6)


def test_isotonic_fit_refuses_tracers():
    z, y = overconfident(100, 3, seed=17)
    with pytest.raises(ValueError, match="runs on the host"):
        jax.jit(posthoc.fit_isotonic)(z, y)


@pytest.mark.long
@pytest.mark.parametrize("name", ["histogram_binning", "isotonic"])
def test_registry_fit_names_variants_and_rejects_bad_options(name):
    z, y = overconfident(400, 3, seed=18)
    assert posthoc.fit(name, z, y).name == name
    cal = posthoc.fit(name, z, y, variant="one_vs_rest")
    assert cal.name == f"{name}(one_vs_rest)"
    np.testing.assert_allclose(np.exp(np.asarray(cal.apply(z))).sum(1), 1.0, atol=1e-5)
    with pytest.raises(
        ValueError, match=r"variant must be one of .*got 'classwise'"
    ) as e:
        posthoc.fit(name, z, y, variant="classwise")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown option"):
        posthoc.fit(name, z, y, temperature=1.0)
