"""Multi-label ECE (calib_jax.metrics._multilabel) against float64 references.

The reference restates the rule one label at a time in float64: sigmoid of
the logits, each label's entries binned by the preset's rule
(``_reference_metrics.bin_of`` / ``equal_mass_members``), the binary gap
``|mean label - mean prob|`` weighted by ``n_b / N``.
"""

from __future__ import annotations

import functools

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from calib_jax import kernels, metrics

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _data(n=240, num_labels=4, seed=0):
    """Sigmoid logits ``[N, L]`` (over-confident by 2x) and 0/1 targets."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(n, num_labels)) * 1.5 + rng.normal(size=num_labels)
    y = (rng.random((n, num_labels)) < 1.0 / (1.0 + np.exp(-g))).astype(np.int32)
    return (2.0 * g).astype(np.float32), y


def _sigmoid64(z):
    """Float64 sigmoid, rounded to the float32 values that get binned (the
    interpolating equal-mass rules compare data values with edges made of
    data values; the gaps change by < 1e-7)."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))
    return p.astype(np.float32).astype(np.float64)


def _binary_ece(p, y, n_total, members):
    """Sum over bins of ``n_b / N |mean y - mean p|`` (float64 loop)."""
    total = 0.0
    for idx in members:
        if idx:
            gap = sum(y[i] for i in idx) / len(idx) - sum(p[i] for i in idx) / len(idx)
            total += len(idx) / n_total * abs(gap)
    return total


def _members(p, m, preset, binning):
    if binning == "equal_width":
        return ref.binned_members(list(p), m, preset)
    return ref.equal_mass_members(list(p), m, ref.PRESET_RULES[preset][4])


def ref_per_label(probs, labels, m=15, preset="calib_jax", binning="equal_width"):
    probs = np.asarray(probs, np.float64)
    labels = np.asarray(labels, np.float64)
    n = probs.shape[0]
    return np.array(
        [
            _binary_ece(p, y, n, _members(p, m, preset, binning))
            for p, y in zip(probs.T, labels.T)
        ]
    )


def ref_micro(probs, labels, m=15, preset="calib_jax", binning="equal_width"):
    p = np.asarray(probs, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    return _binary_ece(p, y, p.size, _members(p, m, preset, binning))


WIDTH_PRESETS = sorted(ref.PRESET_RULES)
MASS_PRESETS = sorted(k for k, v in ref.PRESET_RULES.items() if v[4] is not None)


@pytest.mark.parametrize("preset", WIDTH_PRESETS)
def test_equal_width_per_label_matches_float64_one_label_at_a_time(preset):
    z, y = _data()
    got = metrics.multilabel_ece(z, y, average="none", convention=preset)
    assert got.shape == (4,) and got.dtype == jnp.float32
    np.testing.assert_allclose(
        got, ref_per_label(_sigmoid64(z), y, preset=preset), **TOL
    )


@pytest.mark.long
@pytest.mark.parametrize("preset", MASS_PRESETS)
def test_equal_mass_per_label_matches_float64_one_label_at_a_time(preset):
    z, y = _data(n=150, num_labels=3, seed=1)
    got = metrics.multilabel_ece(
        z, y, average="none", binning="equal_mass", num_bins=10, convention=preset
    )
    expected = ref_per_label(
        _sigmoid64(z), y, m=10, preset=preset, binning="equal_mass"
    )
    np.testing.assert_allclose(got, expected, **TOL)


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_macro_and_micro_definitions(binning):
    z, y = _data(n=120, num_labels=3, seed=2)
    p64 = _sigmoid64(z)
    macro = metrics.multilabel_ece(z, y, binning=binning, num_bins=8)
    micro = metrics.multilabel_ece(z, y, binning=binning, num_bins=8, average="micro")
    per_label = ref_per_label(p64, y, m=8, binning=binning)
    np.testing.assert_allclose(float(macro), per_label.mean(), **TOL)
    np.testing.assert_allclose(
        float(micro), ref_micro(p64, y, m=8, binning=binning), **TOL
    )


def test_probabilities_on_the_edges_follow_the_ece_convention():
    # Exactly k/M (float32), 0 and 1.0: bins [E_k, E_k+1), 0 first, 1.0 last.
    m = 10
    rng = np.random.default_rng(3)
    grid = (np.arange(m + 1) / m).astype(np.float32)
    probs = rng.choice(grid, size=(200, 2)).astype(np.float32)
    y = (rng.random((200, 2)) < 0.5).astype(np.int32)
    for preset in ("calib_jax", "focal_calibration", "netcal"):
        got = metrics.multilabel_ece(
            probs, y, num_bins=m, inputs="probs", average="none", convention=preset
        )
        expected = ref_per_label(probs.astype(np.float64), y, m=m, preset=preset)
        np.testing.assert_allclose(got, expected, **TOL)


def test_single_label_equals_the_binary_binned_stats():
    # L = 1: the binary convention of BinnedStats.from_confidences (a problem
    # scored by one probability), whatever the averaging.
    z, y = _data(n=300, num_labels=1, seed=4)
    p = np.asarray(jax.nn.sigmoid(z[:, 0]))
    binary = metrics.BinnedStats.from_confidences(p, y[:, 0].astype(bool)).compute()
    for average in ("macro", "micro"):
        got = metrics.multilabel_ece(p[:, None], y, inputs="probs", average=average)
        np.testing.assert_allclose(float(got), float(binary), **TOL)


@pytest.mark.long
@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_one_hot_labels_of_a_softmax_give_the_classwise_ece(binning):
    # With K classes as K labels, the macro value is Def. A.1's class-wise ECE.
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(200, 5)) * 2.0
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
    labels = rng.integers(0, 5, 200).astype(np.int32)
    one_hot = np.eye(5, dtype=np.int32)[labels]
    got = metrics.multilabel_ece(probs, one_hot, inputs="probs", binning=binning)
    expected = metrics.classwise_ece(probs, labels, binning=binning)
    np.testing.assert_allclose(float(got), float(expected), **TOL)


@pytest.mark.parametrize(
    "binning, average",
    [("equal_width", "none"), ("equal_mass", "none"), ("equal_mass", "micro")],
)
@pytest.mark.long
def test_where_equals_slicing(binning, average):
    z, y = _data(n=100, num_labels=3, seed=6)
    pad_z = np.concatenate([z, np.full((7, 3), np.nan, np.float32)])
    pad_y = np.concatenate([y, np.full((7, 3), 5, np.int32)])
    where = np.arange(107) < 100
    got = metrics.multilabel_ece(
        pad_z, pad_y, where=where, binning=binning, average=average
    )
    want = metrics.multilabel_ece(z, y, binning=binning, average=average)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.long
def test_chunk_sums_merge_to_the_whole_split():
    z, y = _data(n=300, num_labels=5, seed=7)
    whole = metrics.MultilabelStats.from_batch(z, y, num_bins=12)
    merged = metrics.MultilabelStats.empty(5, 12)
    for lo, hi in ((0, 150), (150, 300)):
        merged = merged + metrics.MultilabelStats.from_batch(
            z[lo:hi], y[lo:hi], num_bins=12
        )
    np.testing.assert_array_equal(merged.count, whole.count)
    np.testing.assert_array_equal(merged.sum_label, whole.sum_label)
    assert int(merged.total) == 300
    p64 = _sigmoid64(z)
    per_label = ref_per_label(p64, y, m=12)
    np.testing.assert_allclose(merged.compute("none"), per_label, **TOL)
    np.testing.assert_allclose(float(merged.compute()), per_label.mean(), **TOL)
    np.testing.assert_allclose(
        float(merged.compute("micro")), ref_micro(p64, y, m=12), **TOL
    )
    one_shot = metrics.multilabel_ece(z, y, num_bins=12, average="micro")
    np.testing.assert_allclose(float(merged.compute("micro")), float(one_shot), **TOL)
    with pytest.raises(ValueError, match="cannot merge MultilabelStats"):
        merged.merge(metrics.MultilabelStats.empty(4, 12))


@pytest.mark.long
@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_jit_equals_eager(binning):
    z, y = _data(n=90, num_labels=3, seed=8)
    where = np.arange(90) % 7 != 0
    fn = functools.partial(
        metrics.multilabel_ece, binning=binning, average="none", num_bins=6
    )
    eager = fn(z, y, where=where)
    jitted = jax.jit(fn)(jnp.asarray(z), jnp.asarray(y), where=jnp.asarray(where))
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7)


def test_extreme_logits_bool_labels_and_bf16():
    # log-sigmoid keeps +-200 finite: probabilities exactly 1 and 0.
    z = np.array([[200.0, -200.0], [-200.0, 200.0], [0.0, 0.0]], np.float32)
    y = np.array([[True, False], [False, True], [True, False]])
    got = metrics.multilabel_ece(z, y, average="none", num_bins=4)
    np.testing.assert_allclose(got, [1.0 / 6.0, 1.0 / 6.0], **TOL)
    low = metrics.multilabel_ece(jnp.asarray(z, jnp.bfloat16), y.astype(np.float32))
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(float(low), 1.0 / 6.0, **TOL)


def _rank_reference(p, y, m):
    """Vectorised float64 'rank' equal-mass ECE of one label (np.array_split
    of the sorted values, ties in the group of their first occurrence)."""
    n = p.size
    order = np.argsort(p, kind="stable")
    first = np.searchsorted(p[order], p[order], "left")
    group = np.concatenate(
        [np.full(len(c), g) for g, c in enumerate(np.array_split(np.arange(n), m))]
    )
    bins = group[first]
    return sum(
        abs(p[order][bins == b].sum() - y[order][bins == b].sum()) / n for b in range(m)
    )


@pytest.mark.long
def test_radix_select_path_matches_float64():
    # From 2**15 rows the 'rank' bins come from the radix select, vmapped over
    # labels; the plain kernel form sorts. Ties included (rounded probs).
    rng = np.random.default_rng(9)
    n = 1 << 15
    probs = np.round(rng.random((n, 2)), 3).astype(np.float32)
    y = (rng.random((n, 2)) < probs).astype(np.int32)
    expected = [
        _rank_reference(probs[:, k].astype(np.float64), y[:, k].astype(float), 15)
        for k in range(2)
    ]
    kw = {"inputs": "probs", "binning": "equal_mass", "average": "none"}
    tuned = metrics.multilabel_ece(probs, y, **kw)
    np.testing.assert_allclose(tuned, expected, **TOL)
    with kernels.use("plain"):
        plain = metrics.multilabel_ece(probs, y, **kw)
    # The sort path sums ~2200 float32 probabilities per bin without blocks:
    # an absolute error of ~1e-2 per bin sum, ~3e-7 after dividing by N.
    np.testing.assert_allclose(plain, expected, rtol=0, atol=2e-6)


def test_sharded_rows_equal_one_device():
    # Rows split over the 8 CPU devices (conftest): plain sums over the
    # global batch, so the value is the one-device value.
    z, y = _data(n=160, num_labels=3, seed=10)
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    fn = jax.jit(functools.partial(metrics.multilabel_ece, average="none"))
    sharded = fn(jax.device_put(z, rows), jax.device_put(y, rows))
    np.testing.assert_allclose(
        sharded, metrics.multilabel_ece(z, y, average="none"), **TOL
    )


def test_wide_host_labels_are_checked_before_conversion():
    # int64 2**32 + 1 would wrap to 1 as int32, float64 1 + 1e-12 round to
    # 1.0 as float32: both are rejected with their own value, unless masked.
    z, y = _data(n=20, num_labels=2, seed=11)
    wide = y.astype(np.int64)
    wide[3, 1] = 2**32 + 1
    with pytest.raises(ValueError, match=r"found 4294967297 at row 3, label 1"):
        metrics.multilabel_ece(z, wide)
    near = y.astype(np.float64)
    near[5, 0] = 1.0 + 1e-12
    with pytest.raises(ValueError, match=r"at row 5, label 0 \(1 target"):
        metrics.multilabel_ece(z, near)
    where = np.arange(20) != 3
    masked = metrics.multilabel_ece(z, wide, where=where)
    np.testing.assert_allclose(
        float(masked), float(metrics.multilabel_ece(z, y, where=where)), **TOL
    )


@pytest.mark.parametrize(
    "binning, n",
    [
        ("equal_width", 200),
        ("equal_mass", 200),
        pytest.param("equal_mass", 2**15, marks=pytest.mark.long),  # radix select
    ],
)
def test_probabilities_piled_at_and_just_below_one_match_float64(binning, n):
    # What a confident sigmoid head gives in float32: many entries exactly 1.0,
    # many one or a few ulps below it, and ties among them.
    rng = np.random.default_rng(11)
    below = np.nextafter(np.float32(1.0), np.float32(0.0))
    pool = np.array(
        [1.0, 1.0, below, np.nextafter(below, np.float32(0.0)), 0.99995, 0.5, 0.1],
        np.float32,
    )
    p = pool[rng.integers(0, pool.size, size=(n, 3))]
    y = (rng.random((n, 3)) < 0.9).astype(np.int32)
    got = metrics.multilabel_ece(
        p, y, inputs="probs", average="none", binning=binning, num_bins=10
    )
    expected = ref_per_label(p, y, m=10, binning=binning)
    np.testing.assert_allclose(got, expected, **TOL)
