"""Every order-statistics kernel of the library (radix selects and their
plain sort-and-cut forms) against ``np.sort`` on scores near 1.

A confident classifier's scores crowd the float32 patterns just below 1.0,
where a radix digit takes its largest value; there a row the select had
already discarded must stay discarded (it once landed in the last slot's
count). The inputs: exact 1.0, consecutive float32 values below it, values in
``[0.9999, 1)``, heavy ties, and slot counts on both sides of every change of
digit widths (256 and 1024 slots).
"""

from __future__ import annotations

import functools

import _reference_posthoc as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics.test_order_statistics import _sorted_cut_bins

from calib_jax import kernels, metrics, posthoc
from calib_jax.metrics import _adaptive, _order_statistics
from calib_jax.posthoc import _cpu_kernels, _reduction

ULP = 2.0**-24  # float32 spacing just below 1.0


def near_one(rng, n, low=0.0):
    """float32 scores in ``[low, 1]``, most of them at or just below 1.0."""
    below = 1.0 - ULP * np.arange(1, 300)  # consecutive float32 values
    pools = [
        np.ones(1),
        below,
        rng.uniform(0.9999, 1.0, 500),
        np.array([0.5, 0.9, 0.9999, 1.0 - 2.0**-14]),  # heavy ties
        rng.uniform(low, 1.0, 500),
    ]
    kind = rng.choice(len(pools), n, p=[0.25, 0.25, 0.25, 0.15, 0.10])
    lengths = np.array([len(a) for a in pools])
    starts = np.cumsum(lengths) - lengths
    pick = starts[kind] + rng.integers(0, lengths[kind])
    v = np.concatenate(pools).astype(np.float32)[pick]
    return np.maximum(v, np.float32(low))


def float_bits(v):
    return np.asarray(v, np.float32).view(np.uint32)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["tuned", "plain"])
def test_eight_rows_near_one_one_vs_rest(mode):
    p1 = np.array([0.1, 0.2, 0.3, 0.99995, 0.99996, 0.99997, 0.99998, 0.99999])
    z = np.stack([np.zeros(8), np.log(p1) - np.log1p(-p1)], 1).astype(np.float32)
    y = np.array([0, 0, 1, 1, 0, 1, 1, 1], np.int32)
    with kernels.use(mode, "posthoc_order_statistics"):
        params = posthoc.fit_histogram_binning(z, y, variant="one_vs_rest", num_bins=2)
    p = np.asarray(_reduction.probabilities(jnp.asarray(z)))[:, 1]
    # The 4th smallest ends bin 0: a data value, not a pattern between two.
    assert np.sort(p)[3] == np.float32("0.99995005")
    np.testing.assert_array_equal(
        np.asarray(params["thresholds"][1]), [np.float32("0.99995005")]
    )
    np.testing.assert_array_equal(np.asarray(params["values"][1]), [0.5, 0.75])


# (groups, ranks per group): slots G * R at 256 / 258 and 1024 / 1025, where
# the radix select's digit widths change (``_cpu_kernels._widths``).
SLOTS = [(8, 32), (3, 86), (32, 32), (5, 205)]

# The last group's top value: a key whose digit is the largest one in a pass
# that another follows, so that its slot, the last one, is the one a discarded
# row used to reach (32-bit float keys; top-label keys for K = 4, 25 bits).
LAST_TOP = {
    0: np.float32(1.0 - 3 * ULP),
    4: np.uint32(0x3E7FF000 + 0x00FFFFC0).view(np.float32),
}


def test_top_label_keys_of_four_classes_take_25_bits():
    low = int((np.float32(1) / np.float32(4)).view(np.uint32)) - 4096
    assert low == 0x3E7FF000
    assert (int(np.float32(1).view(np.uint32)) - low).bit_length() == 25
    assert len(_cpu_kernels._widths(1024, 25)) == 3


@pytest.mark.long
@pytest.mark.parametrize("form", ["tuned", "plain"])
@pytest.mark.parametrize("top_label_of", [0, 4])
@pytest.mark.parametrize(("g", "r"), SLOTS)
def test_grouped_cut_is_the_sorted_values(g, r, top_label_of, form):
    rng = np.random.default_rng(g * r + top_label_of)
    m = g * (2 * r + 40)
    v = near_one(rng, m, low=0.25 if top_label_of else 0.0)
    group = rng.integers(0, g + 1, m).astype(np.int32)  # g: excluded rows
    last = group == g - 1
    v[last] = np.minimum(v[last], LAST_TOP[top_label_of])
    sizes = np.bincount(group, minlength=g + 1)[:g]
    assert sizes.min() >= r
    ranks = [np.sort(np.append(rng.integers(0, n, r - 1), n - 1)) for n in sizes]
    # The last group's top rank alone in its slot: the others below 0.5.
    low = np.sum(v[last] < 0.5)
    assert low > 0
    ranks[-1] = np.append(np.sort(rng.integers(0, low, r - 1)), sizes[-1] - 1)
    ranks = np.stack(ranks).astype(np.int32)
    cut = getattr(_reduction.grouped_cut, form)
    values, count_le, got_sizes = jax.jit(
        functools.partial(
            cut,
            num_groups=g,
            ranks=lambda n: jnp.asarray(ranks),
            top_label_of=top_label_of,
        )
    )(v, group)
    np.testing.assert_array_equal(np.asarray(got_sizes), sizes)
    for c in range(g):
        s = np.sort(v[group == c])
        want = s[ranks[c]]
        np.testing.assert_array_equal(np.asarray(values[c]), want)
        np.testing.assert_array_equal(
            np.asarray(count_le[c]), np.searchsorted(s, want, side="right")
        )
    assert s[-1] == LAST_TOP[top_label_of]


@pytest.mark.parametrize("form", ["tuned", "plain"])
def test_grouped_cut_with_ranks_from_the_group_sizes(form):
    rng = np.random.default_rng(11)
    g, m = 6, 900
    v = near_one(rng, m)
    group = rng.integers(0, g + 1, m).astype(np.int32)
    ranks = functools.partial(_reduction.equal_mass_ranks, num_bins=15)
    cut = getattr(_reduction.grouped_cut, form)
    values, _, _ = jax.jit(functools.partial(cut, ranks=ranks, num_groups=g))(v, group)
    for c in range(g):
        want = ref.equal_mass_thresholds(v[group == c], 15)
        np.testing.assert_array_equal(np.asarray(values[c]).astype(np.float64), want)


@pytest.mark.parametrize("r", [1, 2, 14, 63])
def test_metric_order_statistics_are_the_sorted_values(r):
    rng = np.random.default_rng(r)
    n = 3000
    v = near_one(rng, n)
    valid = rng.random(n) < 0.8
    s = np.sort(float_bits(v[valid]))
    ranks = np.sort(np.append(rng.integers(0, len(s), r - 1), len(s) - 1))
    got = _order_statistics.order_statistics(
        jnp.asarray(float_bits(v)), jnp.asarray(valid), jnp.asarray(ranks, jnp.int32)
    )
    np.testing.assert_array_equal(np.asarray(got), s[ranks])


@pytest.mark.long
@pytest.mark.parametrize("m", [2, 15, 64])
def test_rank_bins_near_one_equal_the_sorted_cut(m):
    rng = np.random.default_rng(m)
    n = 2500
    v = near_one(rng, n)
    valid = rng.random(n) < 0.9
    got = _order_statistics.rank_bins(jnp.asarray(v), jnp.asarray(valid), m)
    np.testing.assert_array_equal(np.asarray(got), _sorted_cut_bins(v, valid, m))


def _two_class_probs(v):
    """float32 ``[N, 2]`` probabilities with column 0 the scores ``v``."""
    v = np.asarray(v, np.float32)
    return np.stack([v, np.float32(1.0) - v], 1)


@pytest.mark.parametrize("mode", ["tuned", "plain"])
@pytest.mark.parametrize(
    "n", [_adaptive.SELECT_MIN_ROWS - 1, _adaptive.SELECT_MIN_ROWS]
)
@pytest.mark.long
def test_adaptive_ece_near_one_matches_float64(n, mode):
    # Below SELECT_MIN_ROWS the bins come from a sort, from it on from the
    # radix select (tuned) or its plain form.
    rng = np.random.default_rng(n)
    conf = near_one(rng, n, low=0.5)
    probs = _two_class_probs(conf)
    # Rows at exactly 1.0 are correct, others 3 times in 10: the bins' gaps
    # differ, so a row in the wrong bin changes the error.
    correct = (conf == 1.0) | (rng.random(n) < 0.3)
    labels = np.where(correct, 0, 1).astype(np.int32)
    where = rng.random(n) < 0.9
    c64 = conf.astype(np.float64)
    correct = correct.astype(np.float64)
    bins = _sorted_cut_bins(c64, where, 15)
    expected = (
        sum(abs(c64[bins == b].sum() - correct[bins == b].sum()) for b in range(15))
        / where.sum()
    )
    with kernels.use(mode, "metric_radix_select"):
        got = metrics.adaptive_ece(probs, labels, where=where)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5, atol=1e-9)


def _logits_near_one(rng, n):
    """float32 logits ``[N, 2]``: class 0's probability near 1 (many exactly
    1.0), a tenth of the rows predicting class 1 at most 0.8, and five rows
    predicting class 1 within ``2**-16`` of 1 (class 1's top one-vs-rest
    threshold alone in the last slot, with a largest digit)."""
    v = near_one(rng, n, low=0.6).astype(np.float64)
    z = np.zeros((n, 2))
    z[:, 0] = np.log(np.maximum(v, 1e-12)) - np.log(np.maximum(1.0 - v, 1e-30))
    z[rng.random(n) < 0.05, 0] = 40.0  # probability exactly 1.0
    flip = rng.random(n) < 0.1
    u = rng.uniform(0.5, 0.8, n)
    z[flip, 0] = np.log1p(-u[flip]) - np.log(u[flip])
    z[-5:, 0], z[-5:, 1] = 0.0, np.linspace(13.5, 14.5, 5)
    return z.astype(np.float32)


# One-vs-rest: 2 (M - 1) slots at 1024 and 1026 (32-bit keys); top-label:
# 256 / 258 and 1024 / 1026 (fewer key bits, three digit widths).
@pytest.mark.parametrize(
    ("variant", "num_bins"),
    [
        ("one_vs_rest", 513),
        ("one_vs_rest", 514),
        ("top_label", 129),
        ("top_label", 130),
        ("top_label", 513),
        ("top_label", 514),
    ],
)
# The plain sort-and-cut has no pass or block boundary; its sizes run in
# make test-slow.
@pytest.mark.parametrize(
    "mode", ["tuned", pytest.param("plain", marks=pytest.mark.long)]
)
@pytest.mark.long
def test_histogram_binning_near_one_matches_float64(variant, num_bins, mode):
    rng = np.random.default_rng(num_bins)
    n, k = 1600, 2
    z = _logits_near_one(rng, n)
    y = np.where(rng.random(n) < 0.9, z.argmax(1), 1 - z.argmax(1)).astype(np.int32)
    with kernels.use(mode, "posthoc_order_statistics"):
        params = posthoc.fit_histogram_binning(z, y, variant=variant, num_bins=num_bins)
    if variant == "one_vs_rest":
        p = np.asarray(_reduction.probabilities(jnp.asarray(z))).astype(np.float64)
        problems = [(p[:, c], y == c) for c in range(k)]
    else:
        pred, conf = (np.asarray(a) for a in _reduction.top_label(jnp.asarray(z)))
        conf = conf.astype(np.float64)
        problems = [(conf[pred == c], (y == c)[pred == c]) for c in range(k)]
    assert (problems[0][0] == 1.0).sum() > 50
    top = np.sort(problems[1][0])[-5:]
    assert np.all((top >= 1.0 - 2.0**-16) & (top < 1.0))
    for c, (scores, targets) in enumerate(problems):
        thr, values = ref.histogram_binning_binary(scores, targets, num_bins)
        np.testing.assert_array_equal(np.asarray(params["thresholds"][c]), thr)
        np.testing.assert_allclose(np.asarray(params["values"][c]), values, rtol=1e-6)
