"""Both formulations of every metric kernel family against float64 references.

``calib_jax.kernels.use`` forces the CPU-tuned kernels ('tuned') or their
plain jnp formulations ('plain'); both must give the float64 reference values
(the plain one is what runs off the CPU where ``kernels.FAMILIES`` says so).
"""

from __future__ import annotations

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics._cases import padded, softmax_case, tie_case, with_max_ties
from metrics.test_order_statistics import _sorted_cut_bins

from calib_jax import kernels, metrics
from calib_jax.metrics import _adaptive

MODES = ("tuned", "plain")
TOL = {"rtol": 1e-5, "atol": 2e-6}

# (family, metric) pairs whose traced program must differ between the forms.
FAMILY_METRICS = {
    "metric_top_label": lambda p, y: metrics.accuracy(p, y),
    "metric_classwise": lambda p, y: metrics.classwise_ece(p, y),
    "sort_keys": lambda p, y: metrics.ks_error(p, y),
}


def _close(value, expected):
    np.testing.assert_allclose(float(value), expected, **TOL)


@pytest.fixture(scope="module")
def k10():
    return padded(*with_max_ties(*softmax_case(n=240, k=10, seed=0)))


@pytest.mark.long
@pytest.mark.parametrize("mode", MODES)
def test_binned_metrics_match_float64(mode, k10):
    pp, pl, w = k10
    probs, labels = pp[w], pl[w]
    wide_p, wide_y = with_max_ties(*softmax_case(n=200, k=64, seed=4))
    with kernels.use(mode):
        _close(metrics.ece(pp, pl, where=w), ref.ece(probs, labels))
        _close(metrics.rmsce(pp, pl, where=w), ref.ece(probs, labels, p=2))
        _close(metrics.mce(pp, pl, where=w), ref.ece(probs, labels, p="inf"))
        _close(metrics.accuracy(pp, pl, where=w), ref.accuracy(probs, labels))
        _close(metrics.classwise_ece(pp, pl, where=w), ref.classwise_ece(probs, labels))
        # K = 64: the blocked packed-key reduction (metric_top_label).
        _close(metrics.ece(wide_p, wide_y), ref.ece(wide_p, wide_y))
        _close(metrics.accuracy(wide_p, wide_y), ref.accuracy(wide_p, wide_y))
        # Exact zeros in no bin: every bin is scattered (no derived first bin).
        _close(
            metrics.classwise_ece(pp, pl, where=w, convention="focal_calibration"),
            ref.classwise_ece(probs, labels, preset="focal_calibration"),
        )


@pytest.mark.long
@pytest.mark.parametrize("mode", MODES)
def test_sort_based_metrics_match_float64(mode, k10):
    pp, pl, w = k10
    probs, labels = pp[w], pl[w]
    tp, ty = tie_case()
    with kernels.use(mode):
        _close(metrics.ks_error(pp, pl, where=w), ref.ks_error(probs, labels))
        _close(metrics.aurc(pp, pl, where=w), ref.aurc(probs, labels))
        _close(metrics.aurc(tp, ty), ref.aurc(tp, ty))
        _close(metrics.adaptive_ece(tp, ty), ref.ece(tp, ty, binning="mass", m=15))
        s_in, s_out = probs[:120].max(1), probs[120:].max(1)
        s_out[:10] = s_in[:10]  # ties between the two sets count half
        _close(metrics.ood_auroc(s_in, s_out), ref.ood_auroc(s_in, s_out))
        _close(metrics.fpr_at_95_tpr(s_in, s_out), ref.fpr_at_tpr(s_in, s_out))


@pytest.mark.parametrize("mode", MODES)
def test_radix_select_family_matches_float64(mode):
    n, k = _adaptive.SELECT_MIN_ROWS + 123, 10
    rng = np.random.default_rng(3)
    pool = rng.normal(scale=2.0, size=(2000, k))
    logits = pool[rng.integers(0, len(pool), n)]  # repeated rows: ties
    labels = rng.integers(0, k, n).astype(np.int32)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    where = rng.random(n) < 0.9
    conf = probs.max(1).astype(np.float64)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    bins = _sorted_cut_bins(conf, where, 15)
    expected = (
        sum(abs(conf[bins == b].sum() - correct[bins == b].sum()) for b in range(15))
        / where.sum()
    )
    with kernels.use(mode, "metric_radix_select"):
        got = metrics.adaptive_ece(probs, labels, where=where)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)


def test_counts_are_identical_and_sums_close_across_forms(k10):
    pp, pl, w = k10
    stats = {}
    for mode in MODES:
        with kernels.use(mode):
            stats[mode] = (
                metrics.BinnedStats.from_batch(pp, pl, where=w),
                metrics.BinnedStats.from_batch(pp, pl, where=w, classwise=True),
            )
    for tuned, plain in zip(stats["tuned"], stats["plain"]):
        np.testing.assert_array_equal(tuned.count, plain.count)
        np.testing.assert_array_equal(tuned.sum_correct, plain.sum_correct)
        np.testing.assert_allclose(tuned.sum_conf, plain.sum_conf, rtol=2e-5)


def test_auto_on_cpu_is_the_tuned_program_bit_for_bit(k10):
    pp, pl, w = k10
    wide_p, wide_y = with_max_ties(*softmax_case(n=200, k=64, seed=4))
    # Families whose off-CPU entry is 'plain' trace both forms under 'auto'.
    calls = (
        lambda: metrics.ece(pp, pl, where=w),
        lambda: metrics.classwise_ece(pp, pl, where=w),
        lambda: metrics.ece(wide_p, wide_y),
    )
    for call in calls:
        with kernels.use("tuned"):
            tuned = np.asarray(call())
        np.testing.assert_array_equal(np.asarray(call()), tuned)


@pytest.mark.parametrize("family", sorted(FAMILY_METRICS))
def test_forcing_a_family_changes_the_traced_program(family, k10):
    pp, pl, _ = k10
    fn = FAMILY_METRICS[family]
    texts = {}
    for mode in MODES:
        with kernels.use(mode, family):
            texts[mode] = str(jax.make_jaxpr(fn)(jnp.asarray(pp), jnp.asarray(pl)))
    assert texts["tuned"] != texts["plain"]


@pytest.mark.long
@pytest.mark.parametrize("k", [10, 64, 1000])
@pytest.mark.parametrize("screen", [False, True])
def test_packed_top_label_whole_rows_equal_the_plain_form(k, screen):
    """The off-CPU branch of the packed top label (one reduction over the
    whole row, what a TPU runs) against ``top_label_plain``: probabilities
    piled at exactly 1.0 and in [0.9999, 1), ties of the maximum before and
    after the label."""
    from calib_jax.metrics import _common, _cpu_kernels

    rng = np.random.default_rng(k)
    n = 512
    top = rng.choice(
        np.array([1.0, 0.99999994, 0.9999, 0.99995, 0.5], np.float32), size=n
    )
    rest = rng.random((n, k)).astype(np.float32) * (1.0 - top)[:, None] / k
    col = rng.integers(0, k, n)
    probs = rest.copy()
    probs[np.arange(n), col] = top
    twin = rng.integers(0, k, n)  # a second maximal class in a third of rows
    tie = rng.random(n) < 0.33
    probs[np.arange(n)[tie], twin[tie]] = top[tie]
    labels = np.where(rng.random(n) < 0.5, col, twin).astype(np.int32)
    p, y = jnp.asarray(probs), jnp.asarray(labels)
    got = _cpu_kernels._top_label_blocks(p, y, screen, k)
    want = _common.top_label_plain(p, y, screen=screen)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_array_equal(np.asarray(got[1]), probs.argmax(1) == labels)
    if screen:
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), rtol=1e-6)
