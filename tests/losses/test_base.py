"""The losses' base (masking helpers, row statistics, true class versus rest)
and the CPU kernels' own helpers, against plain NumPy float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _aurc
from calib_jax.losses import _base as kb
from calib_jax.losses import _cpu_kernels as ck


def _logits(seed, b=12, k=7, scale=3.0):
    rng = np.random.default_rng(seed)
    return rng.normal(scale=scale, size=(b, k)).astype(np.float32)


def test_row_reduce_equals_separate_reductions_and_carries_no_gradient():
    x = _logits(0)
    n = (x > 0).astype(np.int32)
    total, count, low = ck.row_reduce(
        (jnp.asarray(x), jnp.asarray(n), jnp.asarray(x)),
        (0, 0, np.inf),
        (lax.add, lax.add, lax.min),
    )
    np.testing.assert_allclose(total, x.sum(1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(count, n.sum(1))
    np.testing.assert_array_equal(low, x.min(1))
    assert count.dtype == jnp.int32
    g = jax.grad(
        lambda z: jnp.sum(ck.row_reduce((z, z), (0, -np.inf), (lax.add, lax.max))[0])
    )(jnp.asarray(x))
    np.testing.assert_array_equal(g, 0.0)


def test_first_index_and_take_col_follow_argmax_on_ties():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 5.0, 5.0]])
    x = x.astype(np.float32)
    first = kb.first_index(jnp.asarray(x), jnp.asarray(x.max(1)))
    np.testing.assert_array_equal(first, x.argmax(1))
    np.testing.assert_array_equal(kb.take_col(jnp.asarray(x), first), x.max(1))
    # The gather's gradient goes to the one entry taken.
    g = jax.grad(lambda z: jnp.sum(kb.take_col(z, first)))(jnp.asarray(x))
    want = np.zeros_like(x)
    want[np.arange(3), x.argmax(1)] = 1.0
    np.testing.assert_array_equal(g, want)


@pytest.mark.long
def test_zeroing_helpers_keep_nan_of_excluded_rows_out_of_value_and_gradient():
    x = _logits(1, b=4)
    x[2, 3] = np.nan
    y = np.array([1, 2, 9, 0], np.int32)
    mask = np.array([True, True, False, True])
    z, lab = kb.zero_excluded_rows(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))
    np.testing.assert_array_equal(z[2], 0.0)
    np.testing.assert_array_equal(lab, [1, 2, 0, 0])
    np.testing.assert_array_equal(z[mask], x[mask])
    np.testing.assert_array_equal(
        kb.zero_excluded_logits(jnp.asarray(x), jnp.asarray(mask)), z
    )
    g = jax.grad(lambda v: jnp.sum(kb.zero_excluded_logits(v, jnp.asarray(mask)) ** 2))(
        jnp.asarray(x)
    )
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[2] == 0.0)
    values = jnp.asarray([1.0, 3.0, np.nan, 5.0])
    assert float(kb.masked_mean(values, jnp.asarray(mask))) == 3.0
    assert float(kb.masked_sum(values, jnp.asarray(mask))) == 9.0
    assert float(kb.masked_mean(values, jnp.zeros(4, bool))) == 0.0
    np.testing.assert_array_equal(
        kb.zero_masked(values, jnp.asarray(mask)), [1.0, 3.0, 0.0, 5.0]
    )


def test_max_rest_logit_is_the_largest_non_label_logit():
    x = np.array([[5.0, 1.0, 2.0], [5.0, 5.0, 2.0], [0.0, 4.0, 3.0]], np.float32)
    y = np.array([0, 0, 2], np.int32)
    got = ck.max_rest_logit(jnp.asarray(x), jnp.asarray(x[np.arange(3), y]))
    want = [np.delete(row, label).max() for row, label in zip(x, y)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["tuned", "plain"])
def test_true_vs_rest_log_odds_match_float64_at_extreme_confidence(mode):
    x = _logits(2, b=6, k=5).astype(np.float64)
    x[0] = [40.0, 0.0, -1.0, 2.0, 0.5]  # p_y within 1e-16 of 1
    y = np.array([0, 1, 2, 3, 4, 0], np.int32)
    with kernels.use(mode, "loss_true_vs_rest"):
        split = kb.true_vs_rest(
            jnp.asarray(x, jnp.float32), jnp.asarray(y), squares=True
        )
    e = np.exp(x - x.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    rest = np.array([np.delete(row, label) for row, label in zip(x, y)])
    want_d = x[np.arange(6), y] - np.log(np.exp(rest).sum(1))
    np.testing.assert_allclose(split.d, want_d, rtol=1e-5, atol=1e-5)
    want_log_1m = np.log1p(-p[np.arange(6), y][1:])
    np.testing.assert_allclose(split.log_1m_p_true[1:], want_log_1m, rtol=1e-5)
    assert np.isfinite(float(split.log_1m_p_true[0]))
    np.testing.assert_allclose(float(split.log_1m_p_true[0]), -want_d[0], rtol=1e-4)
    ratio = (np.exp(rest) ** 2).sum(1) / np.exp(rest).sum(1) ** 2
    # A difference of two float32 logs: absolute error of a few ulps of 1.
    np.testing.assert_allclose(split.log_sq_ratio, np.log(ratio), rtol=1e-5, atol=1e-6)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["tuned", "plain"])
def test_row_stats_match_float64_with_the_first_argmax_rule(mode):
    x = _logits(3, b=8, k=6)
    x[1] = [1.0, 4.0, 4.0, 0.0, -1.0, 2.0]  # a tie at the top
    y = np.array([0, 2, 1, 3, 4, 5, 0, 1], np.int32)
    y[1] = 1
    with kernels.use(mode, "loss_rows"):
        rows = kb.row_stats(
            jnp.asarray(x),
            jnp.asarray(y),
            ce=True,
            conf=True,
            entropy=True,
            margin=True,
        )
    z = x.astype(np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    top2 = np.sort(p, axis=1)[:, ::-1]
    np.testing.assert_array_equal(rows.correct, (x.argmax(1) == y).astype(np.float32))
    np.testing.assert_allclose(rows.ce, -np.log(p[np.arange(8), y]), rtol=1e-5)
    np.testing.assert_allclose(rows.conf, p.max(1), rtol=1e-6)
    np.testing.assert_allclose(rows.entropy, -(p * np.log(p)).sum(1), rtol=1e-5)
    np.testing.assert_allclose(rows.margin, top2[:, 0] - top2[:, 1], atol=1e-6)


def test_safe_pow_is_zero_with_zero_gradient_at_zero():
    x = jnp.asarray([0.0, 0.25, 4.0])
    np.testing.assert_allclose(kb.safe_pow(x, 0.5), [0.0, 0.5, 2.0])
    g = jax.grad(lambda v: jnp.sum(kb.safe_pow(v, 0.5)))(x)
    np.testing.assert_allclose(g, [0.0, 1.0, 0.25])


def test_tie_groups_of_packed_and_plain_keys_agree_with_numpy():
    key = np.array([0.5, -1.0, 0.5, 2.0, -1.0, 0.0, -3.5], np.float32)
    packed = ck.tie_groups(jnp.asarray(key))
    plain = _aurc.tie_groups.plain(jnp.asarray(key))
    srt = np.sort(key)
    want_first = np.searchsorted(srt, key, side="left")
    want_new = np.concatenate([[True], srt[1:] != srt[:-1]])
    for first, new_group in (packed, plain):
        np.testing.assert_array_equal(first, want_first)
        np.testing.assert_array_equal(new_group, want_new)
