"""The checking contract shared by losses, metrics, post-hoc and conformal."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import _checks

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 5)).astype(np.float32)
Y = RNG.integers(0, 5, 12).astype(np.int32)


def test_is_concrete_and_concrete_float():
    assert _checks.is_concrete(X, None, jnp.ones(3))
    seen = []

    @jax.jit
    def f(x):
        seen.append((_checks.is_concrete(x), _checks.concrete_float(x)))
        return x

    f(1.0)
    assert seen == [(False, None)]
    assert _checks.concrete_float(np.float32(0.5)) == 0.5
    assert _checks.concrete_float(jnp.asarray(2)) == 2.0
    assert _checks.concrete_float(np.ones(3)) is None


@pytest.mark.parametrize(
    "args, error, message",
    [
        (
            (X.astype(np.int32), Y),
            TypeError,
            "logits must be floating point, got dtype int32",
        ),
        ((X, Y.astype(np.float32)), TypeError, "labels must be integer class ids"),
        ((X[0], Y), ValueError, "logits must have shape [B, K], got shape (5,)"),
        ((X, Y[:, None]), ValueError, "labels must have shape [B], got shape (12, 1)"),
        ((X, Y[:-1]), ValueError, "has 12 rows but labels has 11 entries"),
        ((X, Y[:-1]), ValueError, "disagree on the batch size"),
        ((X[:, :1], Y), ValueError, "K = 1 class(es) (shape (12, 1)); at least 2"),
    ],
)
def test_static_checks_name_the_argument_and_shape(args, error, message):
    with pytest.raises(error) as err:
        _checks.check_scores_labels(*args, name="logits", rows="B")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_empty_inputs_only_when_the_purpose_allows():
    x, y, w = _checks.check_scores_labels(X[:0], Y[:0], name="logits")
    assert x.shape == (0, 5) and y.shape == (0,) and w is None
    with pytest.raises(ValueError, match=r"probs is empty \(N = 0\): a metric needs"):
        _checks.check_scores_labels(X[:0], Y[:0], name="probs", purpose="a metric")


def test_where_mask_checks():
    assert _checks.check_where(None, 3) is None
    np.testing.assert_array_equal(_checks.check_where([True, False], 2), [True, False])
    with pytest.raises(TypeError, match="where must be a bool mask, got dtype int32"):
        _checks.check_where(np.ones(2, np.int32), 2)
    with pytest.raises(
        ValueError, match=r"where must have shape \[N\] = \(2,\), got \(3,\)"
    ):
        _checks.check_where(np.ones(3, bool), 2)


def _numpy_summary(x, y, where):
    keep = np.ones(len(y), bool) if where is None else where
    bad = keep & ~np.isfinite(x).all(axis=1)
    out = keep & ((y < 0) | (y >= x.shape[1]))
    i = int(np.argmax(out))
    return (
        int(keep.sum()),
        int(bad.sum()),
        int(np.argmax(bad)),
        int(out.sum()),
        i,
        int(y[i]),
    )


@pytest.mark.long
@pytest.mark.parametrize("masked", [False, True])
def test_value_summary_matches_numpy_and_fuses_under_jit(masked):
    x, y = X.copy(), Y.copy()
    x[3, 1], x[7, 0], x[9, 4] = np.nan, np.inf, -np.inf
    y[2], y[10] = 5, -1
    where = (np.arange(12) != 3) if masked else None
    want = _numpy_summary(x, y, where)

    @jax.jit
    def work_and_summary(x, y, w):
        return jnp.sum(x), _checks.value_summary(x, y, w)

    _, got = work_and_summary(x, y, where)
    assert tuple(int(v) for v in got) == want
    eager = _checks.value_summary(jnp.asarray(x), jnp.asarray(y), where)
    assert tuple(int(v) for v in eager) == want
    row_finite = jnp.isfinite(jnp.sum(x, axis=1))
    cheap = _checks.value_summary(
        jnp.asarray(x), jnp.asarray(y), where, row_finite=row_finite
    )
    assert tuple(int(v) for v in cheap) == want


@pytest.mark.parametrize("family", ["loss", "fit", "metric"])
def test_raise_for_values_nonfinite_one_wording(family):
    x = X.copy()
    x[3, 1] = x[8, 2] = np.nan
    with pytest.raises(ValueError) as err:
        _checks.check_values(jnp.asarray(x), jnp.asarray(Y), family=family)
    assert str(err.value) == "logits contains NaN or inf in 2 row(s) (first: row 3)."


def test_raise_for_values_labels_and_empty_mask():
    y = Y.copy()
    y[4], y[6] = 7, -2
    with pytest.raises(ValueError) as err:
        _checks.check_values(jnp.asarray(X), jnp.asarray(y))
    assert str(err.value) == (
        "labels must lie in [0, K) = [0, 5); found 7 at row 4 (2 label(s) out of "
        "range)."
    )
    with pytest.raises(
        ValueError, match=r"labels must lie in \[0, K\) = \[0, 5\); found -2 at row 6"
    ):
        _checks.check_values(
            jnp.asarray(X), jnp.asarray(y), jnp.arange(12) != 4, family="metric"
        )
    none = jnp.zeros(12, bool)
    with pytest.raises(ValueError, match="where excludes every row: fitting needs"):
        _checks.check_values(jnp.asarray(X), jnp.asarray(y), none)
    _checks.check_values(jnp.asarray(X), jnp.asarray(y), none, allow_empty=True)
    # A masked-out bad row is not an error; traced inputs are not inspected.
    _checks.check_values(jnp.asarray(X), jnp.asarray(y), (y >= 0) & (y < 5))
    jax.jit(lambda x, y: _checks.check_values(x, y) or jnp.sum(x))(X, y)

    @jax.jit
    def traced(x, y):
        s = _checks.value_summary(x, y)
        _checks.raise_for_values(s, 5)
        return s

    assert int(traced(X, y).bad_labels) == 2


def test_scalar_checks():
    assert _checks.check_positive("gamma", 2.0) == 2.0
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="gamma must be > 0, got"):
            _checks.check_positive("gamma", bad)
    with pytest.raises(ValueError, match=r"lam must be >= 0, got -0.5"):
        _checks.check_nonnegative("lam", jnp.float32(-0.5))
    jax.jit(lambda t: _checks.check_positive("t", t))(-1.0)  # traced: unchecked
    _checks.check_unit_interval("q", 1.0)
    _checks.check_unit_interval("q", 0.0, closed_left=True)
    with pytest.raises(ValueError, match=r"q must lie in \(0, 1\], got 0.0"):
        _checks.check_unit_interval("q", 0.0)
    with pytest.raises(ValueError, match=r"a must lie in \(0, 1\), got 1.0"):
        _checks.check_unit_interval("a", 1.0, closed_right=False)
    with pytest.raises(
        ValueError, match=r"binning must be one of \('a', 'b'\), got 'c'"
    ):
        _checks.check_choice("binning", "c", ("a", "b"))
    assert _checks.check_num_bins(np.int64(4)) == 4
    for bad, message in ((0, "num_bins must be >= 1, got 0"), (2.0, "Python int >= 1")):
        with pytest.raises(ValueError, match=message):
            _checks.check_num_bins(bad)
    with pytest.raises(ValueError, match="num_bins"):
        _checks.check_num_bins(True)
    assert _checks.check_positive_int("steps", 3) == 3
    with pytest.raises(TypeError, match="steps must be a Python int >= 1, got 1.5"):
        _checks.check_positive_int("steps", 1.5)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        _checks.check_positive_int("steps", 0)
    assert _checks.check_int("k_reg", 0, minimum=0) == 0
    assert _checks.check_bool("flag", np.bool_(True)) is True
    with pytest.raises(ValueError, match="flag must be True or False, got 1"):
        _checks.check_bool("flag", 1)


def test_count_true_counts_each_mask_in_one_reduction():
    rng = np.random.default_rng(0)
    masks = [rng.random(1000) < q for q in (0.0, 0.3, 1.0)]
    got = jax.jit(_checks.count_true)(*(jnp.asarray(m) for m in masks))
    assert [int(g) for g in got] == [int(m.sum()) for m in masks]
    assert all(g.dtype == jnp.int32 for g in got)
    assert int(_checks.count_true(jnp.zeros((0,), bool))[0]) == 0
