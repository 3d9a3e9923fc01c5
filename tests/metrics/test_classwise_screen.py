"""The value screen computed in the class-wise kernel's own read of ``probs``.

``accumulate_classwise(..., screen=True)`` (both kernel forms) and
``stats_from_batch(..., screen=True)`` also return the row sums of
``_common.screen_values``; the eager ``classwise_ece`` / ``marginal_ece``
hand them to ``_validate.evaluate(..., screened=True)``. Checked here: the
statistics and values are bit-identical with and without the screen, the sums
match a float64 reference, and a bad row is rejected with the message of the
separate screen (``screened=False``, the path before).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics._cases import softmax_case

from calib_jax import kernels, metrics
from calib_jax.metrics import (
    _binned_stats,
    _classwise,
    _common,
    _conventions,
    _validate,
)

MODES = ("tuned", "plain")


def _screen64(probs):
    """Float64 row sums of ``screen_values`` (``2**127`` the float32 scale)."""
    p = np.asarray(probs, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sum(p + (np.abs(p) - p) * 2.0**127, axis=1)


def _bad_rows(probs):
    probs = np.array(probs, np.float32)
    probs[5, 1] = -1e-30  # tiny negative: row sum about 3.4e8
    probs[7, 0] = np.nan
    probs[9] *= np.float32(1.5)
    probs[11, 2] = np.inf  # screened to NaN
    probs[12, 0] = -0.25  # row sum about 4.3e37
    return probs


@pytest.mark.long
@pytest.mark.parametrize("preset", ["calib_jax", "focal_calibration"])
@pytest.mark.parametrize("k", [3, 10, 40, 1000])  # column adds, matvec
@pytest.mark.parametrize("mode", MODES)
def test_kernel_screen_sums_and_unchanged_statistics(mode, k, preset):
    # k = 1000: blocks of CLASSWISE_BLOCK // k = 262 rows, two in the scan
    # plus a remainder of 76 rows.
    n = 600
    probs, labels = softmax_case(n=n, k=k, seed=k)
    probs = _bad_rows(probs)
    valid = np.arange(n) % 5 != 2
    conv = _conventions.PRESETS[preset]
    with kernels.use(mode, "metric_classwise"):
        alone = _binned_stats.accumulate_classwise(
            jnp.asarray(probs),
            jnp.asarray(labels),
            jnp.asarray(valid),
            num_bins=15,
            convention=conv,
        )
        *stats, sums = _binned_stats.accumulate_classwise(
            jnp.asarray(probs),
            jnp.asarray(labels),
            jnp.asarray(valid),
            num_bins=15,
            convention=conv,
            screen=True,
        )
    for a, b in zip(alone, stats):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    sums = np.asarray(sums)
    want = _screen64(probs)
    assert sums.shape == (n,) and sums.dtype == np.float32
    # Every row, excluded ones too; NaN exactly where the reference is NaN.
    np.testing.assert_array_equal(np.isnan(sums), np.isnan(want))
    np.testing.assert_allclose(sums[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6)
    assert np.isnan(sums[[7, 11]]).all()
    assert sums[5] > 1e8 and sums[12] > 1e37
    np.testing.assert_allclose(sums[9], 1.5, rtol=1e-6)


@pytest.mark.long
@pytest.mark.parametrize("classwise", [False, True])
def test_stats_from_batch_screen_is_the_top_label_screen(classwise):
    probs, labels = softmax_case(n=500, k=12, seed=3)
    probs = _bad_rows(probs)
    where = jnp.asarray(np.arange(500) % 7 != 3)
    p, y = jnp.asarray(probs), jnp.asarray(labels)
    conv = _conventions.PRESETS["calib_jax"]
    alone = _binned_stats.stats_from_batch(p, y, where, 15, conv, classwise)
    stats, sums = _binned_stats.stats_from_batch(p, y, where, 15, conv, classwise, True)
    for name in ("count", "sum_conf", "sum_correct", "total"):
        a, b = getattr(alone, name), getattr(stats, name)
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), name
    ref = np.asarray(_common.top_label(p, y, screen=True)[2])
    sums = np.asarray(sums)
    np.testing.assert_array_equal(np.isnan(sums), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(sums[ok], ref[ok], rtol=1e-6)


CORES = [
    ("equal_width", 1.0, "classwise"),
    ("equal_width", 2.0, "classwise"),
    ("equal_width", 2.0, "marginal"),
    ("equal_width", 2.0, "debiased"),
    ("equal_mass", 1.0, "classwise"),
    ("equal_mass", 2.0, "debiased"),
]


@pytest.mark.long
@pytest.mark.parametrize("binning, p, mode", CORES)
def test_core_value_is_bit_identical_with_and_without_screen(binning, p, mode):
    probs, labels = softmax_case(n=640, k=10, seed=11)
    where = jnp.asarray(np.arange(640) % 9 != 4)
    conv = _conventions.PRESETS["calib_jax"]
    args = (jnp.asarray(probs), jnp.asarray(labels), where, 15, binning, conv, p, mode)
    for kernel_mode in MODES:
        with kernels.use(kernel_mode, "metric_classwise"):
            alone = _classwise._classwise_core(*args)
            value, sums = _classwise._classwise_core(*args, True)
        assert np.asarray(alone).tobytes() == np.asarray(value).tobytes()
        if binning == "equal_mass":
            assert sums is None  # the separate screen of probs_summary
        else:
            np.testing.assert_allclose(np.asarray(sums), 1.0, atol=1e-5)


CALLS = {
    "classwise_ece": (lambda p, y: metrics.classwise_ece(p, y), (1.0, "classwise")),
    "classwise_ece_p2": (
        lambda p, y: metrics.classwise_ece(p, y, p=2),
        (2.0, "classwise"),
    ),
    "marginal_ece": (
        lambda p, y: metrics.marginal_ece(p, y, binning="equal_width"),
        (2.0, "marginal"),
    ),
    "debiased": (
        lambda p, y: metrics.marginal_ece(p, y, binning="equal_width", debias=True),
        (2.0, "debiased"),
    ),
}


def _with(probs, row, col, value):
    probs = np.array(probs, np.float32)
    probs[row, col] = value
    return probs


def _scaled(probs, row, factor):
    probs = np.array(probs, np.float32)
    probs[row] *= np.float32(factor)
    return probs


@pytest.mark.parametrize("k", [3, 40])
@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: _with(p, 6, 1, np.nan),
            "probs contains NaN or inf in 1 row(s) (first: row 6)",
        ),
        (
            lambda p: _with(p, 6, 1, -np.inf),
            "probs contains NaN or inf in 1 row(s) (first: row 6)",
        ),
        (lambda p: _with(p, 6, 1, -1e-30), "found values in [-1e-30, "),
        (lambda p: _with(p, 6, 1, -0.25), "found values in [-0.25, "),
        (lambda p: _scaled(p, 6, 0.5), "row 6 sums to 0.5."),
        (lambda p: _scaled(p, 6, 1.0011), "row 6 sums to 1.0011"),
    ],
)
@pytest.mark.long
@pytest.mark.parametrize("call", sorted(CALLS))
def test_screened_call_raises_the_message_of_the_separate_screen(
    call, make, message, k
):
    probs, labels = softmax_case(n=64, k=k, seed=9)
    probs = make(probs)
    fn, (p, mode) = CALLS[call]
    conv = _conventions.PRESETS["calib_jax"]
    for kernel_mode in MODES:
        with kernels.use(kernel_mode, "metric_classwise"):
            with pytest.raises(ValueError) as new:
                fn(probs, labels)
            # The path before: the core alone, the screen a separate reduction.
            with pytest.raises(ValueError) as old:
                _validate.evaluate(
                    _classwise._classwise_core,
                    jnp.asarray(probs),
                    jnp.asarray(labels),
                    None,
                    15,
                    "equal_width",
                    conv,
                    p,
                    mode,
                )
        assert str(new.value) == str(old.value)
        assert message in str(new.value)
        assert "\n" not in str(new.value)
    # Excluded, the same row passes, and the value is that of the other rows.
    keep = np.arange(64) != 6
    got = metrics.classwise_ece(probs, labels, where=keep)
    want = metrics.classwise_ece(probs[keep], labels[keep])
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)


@pytest.mark.long
def test_rows_within_the_tolerance_pass_the_kernel_screen():
    probs, labels = softmax_case(n=64, k=40, seed=9)
    probs = _scaled(_with(probs, 2, 5, -0.0), 3, 1.0009)  # -0.0 and 1 + 9e-4
    value = np.asarray(metrics.classwise_ece(probs, labels))
    jitted = np.asarray(jax.jit(metrics.classwise_ece)(probs, labels))
    assert np.isfinite(value) and value.tobytes() == jitted.tobytes()
    # bf16 rows (tolerance eps = 2**-7; these sum to 1 within 3e-3) pass.
    bf16, lab = softmax_case(n=64, k=40, seed=2)
    bf16 = jnp.asarray(bf16, jnp.bfloat16)
    assert float(jnp.max(jnp.abs(jnp.sum(bf16.astype(jnp.float32), 1) - 1))) > 1e-3
    value = np.asarray(metrics.classwise_ece(bf16, lab))
    jitted = np.asarray(jax.jit(metrics.classwise_ece)(bf16, lab))
    assert value.dtype == np.float32 and value.tobytes() == jitted.tobytes()
