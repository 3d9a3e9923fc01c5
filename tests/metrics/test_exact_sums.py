"""Exact confidence sums (``BinnedStats(exact_sums=True)``, ``_exact_sums``).

The reference is the exact sum in Python integers (units of 2^-149, the
smallest float32 subnormal), rounded to float32 to nearest, ties to even, in
plain Python: independent of the limb code under test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import metrics
from calib_jax.metrics import _exact_sums

_sums = jax.jit(
    lambda v, seg, slots: _exact_sums.to_float32(_exact_sums.slot_sums(v, seg, slots)),
    static_argnums=2,
)


def _rounded(values) -> np.float32:
    """The float32 nearest (ties to even) to the exact sum of ``values``."""
    n = sum(int(math.ldexp(float(v), 149)) for v in np.asarray(values, np.float32))
    if n.bit_length() <= 24:  # subnormal or exponent field 1: exact
        return np.float32(math.ldexp(n, -149))
    shift = n.bit_length() - 24
    q, r = divmod(n, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q % 2):
        q += 1
    return np.float32(math.ldexp(q, shift - 149))


def _softmax_near_one(n, k, seed):
    """Over-confident softmax rows: the top entry piled at and just below 1."""
    rng = np.random.default_rng(seed)
    z = 2.0 * rng.standard_normal((n, k)).astype(np.float32)
    labels = rng.integers(0, k, n).astype(np.int32)
    z[np.arange(n), labels] += rng.choice([7.0, 12.0, 20.0], size=n).astype(np.float32)
    return np.asarray(jax.nn.softmax(jnp.asarray(z), axis=-1)), labels


def _cases():
    probs, _ = _softmax_near_one(300, 10, 0)
    rng = np.random.default_rng(1)
    tiny = np.float32(2.0**-149)
    return {
        "top_entries": probs.max(1),
        "all_entries": probs.reshape(-1),
        "tie_to_even_down": np.float32([1.0, 2.0**-24]),
        "tie_broken_up": np.float32([1.0, 2.0**-24, 2.0**-60]),
        "tie_to_even_up": np.float32([1.0 + 2.0**-23, 2.0**-24]),
        "carry_to_next_power": np.float32([1.0 - 2.0**-24, 2.0**-25]),
        "subnormals": np.float32([tiny, tiny, 3e-39, 2.0**-126 - 2.0**-149]),
        "mixed_scales": (rng.random(2000) ** 40).astype(np.float32),
        "just_below_one": np.full(3000, 1.0 - 2.0**-24, np.float32),
        "zeros": np.zeros(3, np.float32),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_sums_are_the_exact_sums_rounded_once(name):
    values = _cases()[name]
    got = _sums(jnp.asarray(values), jnp.zeros(values.shape, jnp.int32), 1)
    want = _rounded(values)
    assert np.asarray(got)[0].view(np.uint32) == want.view(np.uint32), (got, want)


def test_more_rows_than_one_scatter_holds_are_summed_in_blocks():
    rows = _exact_sums.ROWS + 37
    values = np.full(rows, 0.99999994, np.float32)
    values[::3] = 0.5
    seg = (np.arange(rows) % 2).astype(np.int32)
    got = np.asarray(_sums(jnp.asarray(values), jnp.asarray(seg), 2))
    for s in (0, 1):
        assert got[s] == _rounded(values[seg == s])


def _batches(probs, labels, classwise, order, size=250):
    stats = None
    for start in order:
        part = metrics.BinnedStats.from_batch(
            probs[start : start + size],
            labels[start : start + size],
            classwise=classwise,
            exact_sums=True,
        )
        stats = part if stats is None else part.merge(stats)
    return stats


@pytest.mark.parametrize(
    "classwise",
    [False, pytest.param(True, marks=pytest.mark.long)],
    ids=["top_label", "classwise"],
)
def test_merged_batches_in_any_order_are_the_one_pass_statistics(classwise):
    probs, labels = _softmax_near_one(1000, 10, 2)
    one = metrics.BinnedStats.from_batch(
        probs, labels, classwise=classwise, exact_sums=True
    )
    plain = metrics.BinnedStats.from_batch(probs, labels, classwise=classwise)
    starts = list(range(0, 1000, 250))
    for order in (starts, starts[::-1]):
        merged = _batches(probs, labels, classwise, order)
        for field in ("count", "sum_correct", "total", "conf_limbs"):
            np.testing.assert_array_equal(getattr(merged, field), getattr(one, field))
        np.testing.assert_array_equal(
            np.asarray(merged.sum_conf).view(np.uint32),
            np.asarray(one.sum_conf).view(np.uint32),
        )
        assert float(merged.compute()) == float(one.compute())
    # Counts are the float32 statistics'; sums their values, rounded once.
    np.testing.assert_array_equal(one.count, plain.count)
    np.testing.assert_array_equal(one.sum_correct, plain.sum_correct)
    entries = probs if classwise else probs.max(1)
    bins = np.clip(np.floor(entries * 15).astype(int), 0, 14)
    if classwise:
        want = [
            [_rounded(probs[:, k][bins[:, k] == s]) for s in range(15)]
            for k in range(10)
        ]
    else:
        want = [_rounded(entries[bins == s]) for s in range(15)]
    np.testing.assert_array_equal(np.asarray(one.sum_conf), np.float32(want))
    np.testing.assert_allclose(one.compute(), plain.compute(), rtol=1e-5)


def test_from_confidences_and_empty_keep_exact_sums():
    probs, labels = _softmax_near_one(200, 10, 3)
    conf, correct = probs.max(1), probs.argmax(1) == labels
    rows = metrics.BinnedStats.from_confidences(conf, correct, exact_sums=True)
    batch = metrics.BinnedStats.from_batch(probs, labels, exact_sums=True)
    empty = metrics.BinnedStats.empty(15, exact_sums=True)
    merged = empty.merge(rows)
    np.testing.assert_array_equal(merged.conf_limbs, batch.conf_limbs)
    np.testing.assert_array_equal(merged.sum_conf, batch.sum_conf)


@pytest.mark.long
def test_class_and_row_sharded_statistics_are_one_devices_bit_for_bit():
    assert jax.device_count() == 8
    probs, labels = _softmax_near_one(256, 64, 4)
    program = jax.jit(
        lambda p, y: metrics.BinnedStats.from_batch(
            p, y, classwise=True, exact_sums=True
        )
    )
    one = program(jnp.asarray(probs), jnp.asarray(labels))
    for shape, spec in (((1, 8), P(None, "vocab")), ((2, 4), P("data", "vocab"))):
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
        p = jax.device_put(probs, NamedSharding(mesh, spec))
        y = jax.device_put(labels, NamedSharding(mesh, P(spec[0])))
        got = program(p, y)
        for field in ("count", "sum_correct", "conf_limbs", "sum_conf"):
            np.testing.assert_array_equal(
                getattr(got, field), getattr(one, field), err_msg=f"{shape} {field}"
            )


def test_mixing_exact_and_float32_sums_is_a_one_line_error():
    probs, labels = _softmax_near_one(20, 10, 5)
    exact = metrics.BinnedStats.from_batch(probs, labels, exact_sums=True)
    plain = metrics.BinnedStats.from_batch(probs, labels)
    for a, b in ((exact, plain), (plain, exact)):
        with pytest.raises(ValueError, match="exact_sums") as err:
            a.merge(b)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="exact_sums must be True or False, got 1"):
        metrics.BinnedStats.from_batch(probs, labels, exact_sums=1)


def test_the_plain_form_equals_the_cpu_scatter_form():
    """Off the CPU the limbs come from one masked reduction instead of
    scatter-adds: the same integers, entries piled just below 1 included."""
    probs, labels = _softmax_near_one(300, 10, 6)
    bins = np.clip(np.floor(probs * 15).astype(np.int32), 0, 14)
    bins[::7, 3] = 15  # dropped entries
    for values, seg in ((probs, bins), (probs.max(1), bins[:, 0])):
        args = (jnp.asarray(values), jnp.asarray(seg), 15)
        plain = _exact_sums.normalize(_exact_sums._dense(*args))
        tuned = _exact_sums.normalize(_exact_sums._scatter(*args))
        np.testing.assert_array_equal(plain, tuned)
        assert plain.shape == (*values.shape[1:], 15, _exact_sums.LIMBS)
