"""Equal-mass 'rank' bins by radix select (large N) against sorting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import metrics
from calib_jax.metrics import _adaptive, _order_statistics


def _sorted_cut_bins(conf, valid, m):
    """float64 NumPy reference of the 'rank' rule: array_split groups of the
    sorted values, every tie in the group of its first occurrence."""
    conf = np.asarray(conf, np.float64)
    keep = np.flatnonzero(valid)
    s = np.sort(conf[keep])
    group = np.empty(len(s), np.int64)
    for g, chunk in enumerate(np.array_split(np.arange(len(s)), m)):
        group[chunk] = g
    first = np.searchsorted(s, conf[keep], side="left")
    out = np.full(len(conf), -1)
    out[keep] = group[first]
    return out


@pytest.mark.long
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [1, 2, 7, 15, 64])
def test_rank_bins_equal_the_sorted_cut(seed, m):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    kind = seed % 3
    if kind == 0:
        conf = rng.random(n)
    elif kind == 1:  # heavy ties, exact 0 and 1
        conf = rng.choice([0.0, 0.2, 0.5, 0.7, 1.0], n)
    else:  # clustered near 1 (trained networks)
        conf = 1.0 - rng.random(n) ** 6 * 0.3
    conf = conf.astype(np.float32)
    valid = rng.random(n) < (0.7 if seed % 2 else 1.0)
    valid[0] = True
    got = np.asarray(
        _order_statistics.rank_bins(jnp.asarray(conf), jnp.asarray(valid), m)
    )
    np.testing.assert_array_equal(got, _sorted_cut_bins(conf, valid, m))


def test_order_statistics_are_the_sorted_values():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)
    bits[:1000] = bits[1000:2000]  # duplicates
    valid = rng.random(5000) < 0.9
    s = np.sort(bits[valid])
    ranks = np.array([0, 1, 17, 17, 2000, len(s) - 2, len(s) - 1], np.int32)
    got = _order_statistics.order_statistics(
        jnp.asarray(bits), jnp.asarray(valid), jnp.asarray(ranks)
    )
    np.testing.assert_array_equal(np.asarray(got), s[ranks])


@pytest.mark.long
@pytest.mark.parametrize("p", [1, 2])
def test_adaptive_ece_from_radix_select_matches_float64(p):
    n, k = _adaptive.SELECT_MIN_ROWS + 1234, 10
    rng = np.random.default_rng(3)
    pool = rng.normal(scale=2.0, size=(3000, k))
    pool[:, 0] += 2.0
    logits = pool[rng.integers(0, len(pool), n)]  # rows repeat: tied confidences
    labels = np.where(rng.random(n) < 0.7, 0, rng.integers(0, k, n))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    where = rng.random(n) < 0.9
    conf = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    assert len(np.unique(conf[where])) < where.sum() // 10  # ties are common
    bins = _sorted_cut_bins(conf, where, 15)
    gaps, total = [], where.sum()
    for b in range(15):
        members = bins == b
        if members.any():
            gap = abs(conf[members].astype(np.float64).mean() - correct[members].mean())
            gaps.append((members.sum() / total, gap))
    expected = sum(w * g**p for w, g in gaps) ** (1 / p)
    got = metrics.adaptive_ece(probs, labels, where=where, p=p)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # The same bins through ece(binning='equal_mass').
    same = metrics.ece(probs, labels, where=where, p=p, binning="equal_mass")
    np.testing.assert_allclose(float(same), float(got), rtol=1e-6)


def test_radix_select_path_sharded_equals_single_device():
    n, k = _adaptive.SELECT_MIN_ROWS, 10
    rng = np.random.default_rng(5)
    logits = rng.normal(scale=3.0, size=(n, k))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    labels = rng.integers(0, k, n).astype(np.int32)
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    f = jax.jit(lambda p, y: metrics.adaptive_ece(p, y))
    sharded = f(jax.device_put(probs, rows), jax.device_put(labels, rows))
    single = f(jax.device_put(probs, jax.devices()[0]), labels)
    np.testing.assert_allclose(sharded, single, rtol=1e-6)


# Every packed-key / radix-select / blocked kernel that stays (kernel families
# of calib_jax.kernels) against its plain form and NumPy on float32 values
# piled at 1.0: exact 1.0, consecutive floats just below it, [0.9999, 1),
# ties; sizes on both sides of a block or pass boundary.
ULP = 2.0**-24


def _near_one(rng, n):
    pools = np.concatenate(
        [
            np.ones(8),
            1.0 - ULP * np.arange(1, 40),
            rng.uniform(0.9999, 1.0, 40),
            [0.5, 0.9, 0.9999, 1.0 - 2.0**-14],
        ]
    ).astype(np.float32)
    return pools[rng.integers(0, len(pools), n)]


def _near_one_probs(rng, n, k):
    """float32 ``[N, K]``: a top entry near 1 (ties between two classes in
    some rows) and the rest spread over the other classes."""
    probs = rng.random((n, k)).astype(np.float32) * 1e-6
    top = _near_one(rng, n)
    cls = rng.integers(0, k, n)
    probs[np.arange(n), cls] = top
    tie = rng.random(n) < 0.2  # the same maximum at a second class
    probs[tie, (cls[tie] + 1 + rng.integers(0, k - 1, tie.sum())) % k] = top[tie]
    return probs


@pytest.mark.parametrize("k", [2, 10, 32, 33, 64, 1000])
def test_top_label_forms_near_one_equal_numpy(k):
    from calib_jax import kernels
    from calib_jax.metrics import _common

    rng = np.random.default_rng(k)
    probs = _near_one_probs(rng, 300, k)
    labels = np.where(rng.random(300) < 0.5, probs.argmax(1), rng.integers(0, k, 300))
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "metric_top_label"):
            conf, correct = jax.jit(_common.top_label)(
                jnp.asarray(probs), jnp.asarray(labels, jnp.int32)
            )
        np.testing.assert_array_equal(np.asarray(conf), probs.max(1))
        np.testing.assert_array_equal(np.asarray(correct), probs.argmax(1) == labels)


@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2, 257])
def test_sorted_by_confidence_forms_near_one_equal_numpy(n):
    from calib_jax import kernels
    from calib_jax.metrics import _common

    rng = np.random.default_rng(n)
    conf, flag = _near_one(rng, n), rng.random(n) < 0.5
    valid = rng.random(n) < 0.8
    valid[0] = True
    order = np.lexsort((flag[valid], conf[valid]))
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "sort_keys"):
            s, f = _common.sorted_by_confidence(
                jnp.asarray(conf), jnp.asarray(flag), jnp.asarray(valid)
            )
        m = int(valid.sum())
        np.testing.assert_array_equal(np.asarray(s)[:m], conf[valid][order])
        np.testing.assert_array_equal(np.asarray(f)[:m], flag[valid][order])


def test_ood_rank_forms_near_one_equal_the_reference():
    import _reference_metrics as ref

    from calib_jax import kernels

    rng = np.random.default_rng(5)
    s_in, s_out = _near_one(rng, 300), _near_one(rng, 200)
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "sort_keys"):
            auroc = metrics.ood_auroc(s_in, s_out)
            fpr = metrics.fpr_at_95_tpr(s_in, s_out)
        np.testing.assert_allclose(float(auroc), ref.ood_auroc(s_in, s_out), rtol=1e-6)
        np.testing.assert_allclose(float(fpr), ref.fpr_at_tpr(s_in, s_out), rtol=1e-6)


@pytest.mark.parametrize("m", [2, 15, pytest.param(64, marks=pytest.mark.long)])
def test_rank_stats_forms_near_one_are_the_sorted_cut(m):
    from calib_jax import kernels

    rng = np.random.default_rng(m)
    n = 3000
    conf = _near_one(rng, n)
    correct = rng.random(n) < 0.7
    valid = rng.random(n) < 0.9
    bins = _sorted_cut_bins(conf, valid, m)
    want = np.bincount(bins[valid], minlength=m)
    want_correct = np.bincount(bins[valid], weights=correct[valid], minlength=m)
    args = jnp.asarray(conf), jnp.asarray(correct), jnp.asarray(valid)
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "metric_radix_select"):
            count, sum_conf, n_correct, total = _adaptive.rank_stats(*args, num_bins=m)
        np.testing.assert_array_equal(np.asarray(count), want)
        np.testing.assert_array_equal(np.asarray(n_correct), want_correct)
        np.testing.assert_allclose(
            np.asarray(sum_conf),
            np.bincount(bins[valid], weights=conf[valid], minlength=m),
            rtol=1e-5,  # float32 sums of thousands of values
        )
        assert int(total) == valid.sum()


@pytest.mark.parametrize(
    "extra",
    [
        -1,
        1,
        pytest.param(0, marks=pytest.mark.long),
        pytest.param(263, marks=pytest.mark.long),
    ],
)
@pytest.mark.long
def test_classwise_forms_near_one_across_a_row_block(extra):
    # K = 1000: a scan block of the tuned kernel holds 262 rows.
    from calib_jax import kernels
    from calib_jax.metrics import _binned_stats, _conventions, _cpu_kernels

    k = 1000
    n = _cpu_kernels.CLASSWISE_BLOCK // k + extra
    rng = np.random.default_rng(n)
    probs = _near_one_probs(rng, n, k)
    labels = rng.integers(0, k, n).astype(np.int32)
    valid = rng.random(n) < 0.9
    conv = _conventions.PRESETS["calib_jax"]
    bins = np.asarray(_conventions.bin_index(jnp.asarray(probs), 15, conv))
    seg = (np.arange(k)[None, :] * 15 + bins)[valid].ravel()
    want = np.bincount(seg, minlength=k * 15).reshape(k, 15)
    want_sum = np.bincount(seg, probs[valid].ravel().astype(np.float64), k * 15)
    lab = (labels[:, None] == np.arange(k)[None, :])[valid].ravel()
    want_correct = np.bincount(seg[lab], minlength=k * 15).reshape(k, 15)
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "metric_classwise"):
            count, sum_conf, n_correct = _binned_stats.accumulate_classwise(
                jnp.asarray(probs),
                jnp.asarray(labels),
                jnp.asarray(valid),
                num_bins=15,
                convention=conv,
            )
        np.testing.assert_array_equal(np.asarray(count), want)
        np.testing.assert_array_equal(np.asarray(n_correct), want_correct)
        np.testing.assert_allclose(
            np.asarray(sum_conf).ravel(), want_sum, rtol=1e-5, atol=1e-3
        )
