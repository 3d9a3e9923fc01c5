"""Logits in and top-label rows in, for every metric of ``metrics.METRICS``.

Every metric that takes ``(probs, labels)`` is checked on one "real
classifier" case: float32 logits whose softmax piles confidences at exactly
1.0 and just below it, exact ties of the top logits (as bf16 logits have),
and labels that are usually the argmax. The claims:

- logits in equals probabilities in of ``jax.nn.softmax(logits)``: exactly
  for the top-label metrics (their confidence is ``1 / sum_k exp(z_k - m)``,
  the largest softmax entry computed the same way, and the first maximal
  logit is the first maximal probability on this data), within 1e-6
  relative for the sums of NLL, Brier and the class-wise metrics (float32
  rounding of ``log`` / ``exp`` per row; the class-wise softmax is fused
  into the binning);
- bf16 logits equal the probabilities of the bf16 logits upcast to float32;
- ``TopLabelRows`` from ``top_label_rows(probs, labels)`` give the value of
  probabilities in bit for bit;
- jit of the logits path equals the eager call;
- the logits path against float64 NumPy (rows, NLL with an underflowing
  softmax, Brier) and the one documented difference of the tie rule;
- bad inputs: one line each.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import metrics
from calib_jax.metrics import _logit_rows

N, K = 256, 10
# Metrics whose value is a sum of per-row terms that the logits path computes
# with other float32 roundings: relative tolerance (see the module docstring).
SUMS = {"nll": 1e-6, "brier": 1e-6, "classwise_ece": 1e-6, "marginal_ece": 1e-6}
NEEDS_K = ("classwise_ece", "marginal_ece", "nll", "brier")
OPTIONS = {"risk_at_coverage": {"coverage": 0.7}, "coverage_at_risk": {"risk": 0.05}}
NAMES = tuple(
    name
    for name, fn in metrics.METRICS.items()
    if "from_logits" in inspect.signature(fn).parameters
)
# make test runs one metric of each kind of input path (top-label rows, the
# LSE, the fused class-wise softmax); every metric runs as long.
FAST = ("ece", "nll", "classwise_ece")
FAST_BF16 = ("ece",)


def _params(fast):
    return [
        name if name in fast else pytest.param(name, marks=pytest.mark.long)
        for name in NAMES
    ]


def _logits(seed=0):
    """Float32 logits of a confident classifier: a quarter of the rows with a
    top-logit margin of 20-30 (confidence exactly 1.0 in float32), a quarter
    with 9-16 (just below 1.0), the rest spread out; rows 0-7 tie their top
    two logits exactly."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, N)
    z = rng.normal(scale=2.0, size=(N, K))
    pred = np.where(rng.random(N) < 0.8, labels, rng.integers(0, K, N))
    margin = np.concatenate(
        [
            rng.uniform(20, 30, N // 4),
            rng.uniform(9, 16, N // 4),
            rng.uniform(0, 4, N - N // 2),
        ]
    )
    z[np.arange(N), pred] = z.max(axis=1) + margin
    z[:8, 1] = z[:8, 0] = z[:8].max(axis=1)
    z += rng.normal(scale=3.0, size=(N, 1))  # row offsets: LSE far from 0
    return z.astype(np.float32), labels.astype(np.int32)


LOGITS, LABELS = _logits()
WHERE = np.arange(N) % 9 != 4
BF16 = jnp.asarray(LOGITS, jnp.bfloat16)


def _call(name, x, labels, **kw):
    return metrics.METRICS[name](x, labels, **OPTIONS.get(name, {}), **kw)


def _leaves(value):
    return [np.asarray(v) for v in jax.tree.leaves(value)]


def _assert_same(got, want, rtol=0.0):
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        if rtol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=0)
        else:
            np.testing.assert_array_equal(g, w)


def test_the_case_piles_confidences_at_and_just_below_one():
    conf = np.asarray(jnp.max(jax.nn.softmax(LOGITS), axis=1))
    assert np.sum(conf == 1.0) >= N // 5
    assert np.sum((conf < 1.0) & (conf > 1.0 - 1e-3)) >= N // 5
    bf = np.asarray(jnp.max(jax.nn.softmax(BF16.astype(jnp.float32)), axis=1))
    assert np.sum(bf == 1.0) >= N // 5


def test_every_metric_taking_probs_takes_logits():
    assert set(NAMES) == set(metrics.METRICS) - {
        "ood_auroc",
        "ood_aupr",
        "fpr_at_95_tpr",
    }


@pytest.mark.long
@pytest.mark.parametrize("name", _params(FAST))
def test_logits_in_equals_probs_in_and_rows_in_equal_probs_in_bitwise(name):
    probs = jax.nn.softmax(jnp.asarray(LOGITS), axis=-1)
    want = _call(name, probs, LABELS)
    _assert_same(_call(name, LOGITS, LABELS, from_logits=True), want, SUMS.get(name))
    if name in NEEDS_K:
        rows = metrics.top_label_rows(probs, LABELS)
        with pytest.raises(ValueError, match=rf"^{name} needs \[N, K\]") as info:
            _call(name, rows, None)
        assert "\n" not in str(info.value)
        return
    _assert_same(_call(name, metrics.top_label_rows(probs, LABELS), None), want)


@pytest.mark.parametrize("name", _params(FAST_BF16))
def test_bf16_logits_equal_probs_of_the_upcast_logits_under_a_mask(name):
    probs = jax.nn.softmax(BF16.astype(jnp.float32), axis=-1)
    want = _call(name, probs, LABELS, where=WHERE)
    got = _call(name, BF16, LABELS, from_logits=True, where=WHERE)
    _assert_same(got, want, SUMS.get(name))
    if name not in NEEDS_K:
        rows = metrics.top_label_rows(BF16, LABELS, from_logits=True, where=WHERE)
        _assert_same(_call(name, rows, None, where=WHERE), got)


def test_rows_of_logits_against_float64():
    rows = metrics.top_label_rows(LOGITS, LABELS, from_logits=True)
    z = LOGITS.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert rows.confidence.dtype == jnp.float32
    # float32 exp, row sum and division: a few ulp.
    np.testing.assert_allclose(rows.confidence, p.max(axis=1), rtol=5e-7, atol=0)
    np.testing.assert_array_equal(rows.correct, np.argmax(z, axis=1) == LABELS)
    # The largest softmax entry bit for bit, the same tie rule on this data.
    probs = jax.nn.softmax(jnp.asarray(LOGITS), axis=-1)
    from_probs = metrics.top_label_rows(probs, LABELS)
    np.testing.assert_array_equal(rows.confidence, from_probs.confidence)
    np.testing.assert_array_equal(rows.correct, from_probs.correct)


def test_nll_and_brier_of_logits_against_float64_where_the_softmax_underflows():
    z = LOGITS.astype(np.float64).copy()
    z[:4, LABELS[:4]] = z[:4].max(axis=1) - 120.0  # p_y ~ e^-120: 0 in float32
    lse = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1))
    lse += z.max(axis=1)
    p = np.exp(z - lse[:, None])
    want_nll = np.mean(lse - z[np.arange(N), LABELS])
    want_brier = np.mean(np.sum(p**2, axis=1) - 2 * p[np.arange(N), LABELS] + 1)
    x = z.astype(np.float32)
    got = metrics.nll(x, LABELS, from_logits=True)
    np.testing.assert_allclose(float(got), want_nll, rtol=1e-6)
    np.testing.assert_allclose(
        float(metrics.brier(x, LABELS, from_logits=True)), want_brier, rtol=1e-6
    )
    # Probabilities in clamp the underflowed p_y at the smallest normal
    # float: -log(1.18e-38) = 87.3 instead of about 120 for those rows.
    clamped = float(metrics.nll(jax.nn.softmax(jnp.asarray(x)), LABELS))
    assert clamped < float(got) - 4 * (120 - 87.4) / N * 0.9


def test_distinct_top_logits_that_round_to_one_probability():
    # z1 is the float32 neighbour above z0; with two more classes at the same
    # value the four probabilities round to equal floats. Probabilities give
    # the first class (0), logits the class of the larger logit (1).
    z0 = np.float32(0.3)
    z1 = np.nextafter(z0, np.float32(1))
    x = np.array([[z0, z1, z0, z0]] * 2, np.float32)
    labels = np.array([1, 0], np.int32)
    p = np.asarray(jax.nn.softmax(jnp.asarray(x), axis=-1))
    assert p[0, 0] == p[0, 1]
    assert metrics.top_label_rows(p, labels).correct.tolist() == [False, True]
    rows = metrics.top_label_rows(x, labels, from_logits=True)
    assert rows.correct.tolist() == [True, False]
    np.testing.assert_array_equal(rows.confidence, p.max(axis=1))


@pytest.mark.parametrize("name", ["ece", "nll"])
def test_jit_of_the_logits_path_equals_eager(name):
    eager = _call(name, LOGITS, LABELS, from_logits=True)
    jitted = jax.jit(lambda z, y: _call(name, z, y, from_logits=True))(LOGITS, LABELS)
    np.testing.assert_array_equal(jitted, eager)


@pytest.mark.long
def test_jit_of_the_logits_summary_equals_eager_and_each_metric():
    eager = metrics.summary(LOGITS, LABELS, from_logits=True)
    jitted = jax.jit(lambda z, y: metrics.summary(z, y, from_logits=True))(
        LOGITS, LABELS
    )
    for key, fn in metrics.summary_functions(15, from_logits=True).items():
        np.testing.assert_array_equal(jitted[key], eager[key])
        np.testing.assert_array_equal(eager[key], fn(LOGITS, LABELS))


def test_summary_functions_pass_from_logits_through():
    functions = metrics.summary_functions(15, from_logits=True)
    assert functions is metrics.summary_functions(15, from_logits=True)
    probs = jax.nn.softmax(jnp.asarray(LOGITS), axis=-1)
    value = functions["ece"](LOGITS, LABELS)
    np.testing.assert_array_equal(value, metrics.ece(probs, LABELS))


def test_rows_carry_the_confidence_dtype_of_the_probabilities():
    probs = jax.nn.softmax(BF16, axis=-1)  # bf16 rows may exceed 1 by 2**-8
    rows = metrics.top_label_rows(probs, LABELS)
    assert rows.confidence.dtype == jnp.bfloat16
    np.testing.assert_array_equal(metrics.ece(rows, None), metrics.ece(probs, LABELS))


def _one_line(exc_type, fn, match):
    with pytest.raises(exc_type, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_bad_inputs_one_line_each():
    bad = LOGITS.copy()
    bad[3, 2] = np.nan
    bad[5, 0] = -np.inf
    _one_line(
        ValueError,
        lambda: metrics.ece(bad, LABELS, from_logits=True),
        r"^logits contains NaN or inf in 2 row\(s\) \(first: row 3\)\.$",
    )
    _one_line(
        ValueError,
        lambda: metrics.nll(bad, LABELS, from_logits=True),
        r"^logits contains NaN or inf",
    )
    # Excluded rows are not checked.
    keep = np.ones(N, bool)
    keep[[3, 5]] = False
    assert np.isfinite(float(metrics.ece(bad, LABELS, from_logits=True, where=keep)))
    rows = metrics.top_label_rows(LOGITS, LABELS, from_logits=True)
    _one_line(
        ValueError,
        lambda: metrics.ece(rows, LABELS),
        r"^labels must be None with TopLabelRows",
    )
    _one_line(
        ValueError,
        lambda: metrics.classwise_ece(rows, None),
        r"^classwise_ece needs \[N, K\] probabilities",
    )
    _one_line(
        ValueError,
        lambda: metrics.ece(rows, None, from_logits=True),
        r"^from_logits=True takes \[N, K\] logits",
    )
    _one_line(
        ValueError,
        lambda: metrics.ece(LOGITS[:, 0], LABELS, from_logits=True),
        r"^logits must have shape \[N, K\], got shape \(256,\)",
    )
    _one_line(
        TypeError,
        lambda: metrics.ece(LOGITS.astype(np.int32), LABELS, from_logits=True),
        r"^logits must be floating point, got dtype int32",
    )
    _one_line(
        ValueError,
        lambda: metrics.ece(LOGITS, LABELS, from_logits="yes"),
        r"^from_logits must be True or False",
    )
    _one_line(
        ValueError,
        lambda: metrics.ece(LOGITS, LABELS),
        r"If these are logits, pass from_logits=True \(or jax\.nn\.softmax",
    )
    over = metrics.TopLabelRows(rows.confidence.at[7].set(1.5), rows.correct)
    _one_line(
        ValueError,
        lambda: metrics.ece(over, None),
        r"^confidence must be top-label probabilities in \[0, 1\].*1\.5 at row 7",
    )
    ints = metrics.TopLabelRows(rows.confidence, rows.correct.astype(jnp.int32))
    _one_line(
        TypeError, lambda: metrics.ece(ints, None), r"^correct must be a bool \[N\]"
    )
    _one_line(
        ValueError,
        lambda: metrics.smooth_ece(rows, None, target="binary"),
        r"^target='binary' needs \[N, 2\]",
    )
    _one_line(
        ValueError,
        lambda: metrics.top_label_rows(LOGITS, LABELS + 10, from_logits=True),
        r"^labels must lie in \[0, K\) = \[0, 10\)",
    )


def _blocked_and_whole(x, y):
    return (
        (*_logit_rows.logit_reductions(x, y), _logit_rows.brier_rows(x, y)),
        (*_logit_rows._reductions(x, y), _logit_rows._brier(x, y)),
    )


@pytest.mark.parametrize(
    "dtype", [jnp.bfloat16, pytest.param(jnp.float32, marks=pytest.mark.long)]
)
def test_row_blocks_on_the_cpu_equal_the_whole_rows(dtype):
    # 2**20 // 4099 = 255 rows per block: two blocks and a remainder of 190.
    rng = np.random.default_rng(3)
    z = rng.normal(scale=4.0, size=(700, 4099)).astype(np.float32)
    y = rng.integers(0, 4099, 700).astype(np.int32)
    blocked, whole = jax.jit(_blocked_and_whole)(jnp.asarray(z, dtype), y)
    # The maxima and the label's logit are exact; the row sums s and the
    # Brier terms may differ by the summation order of XLA's two reduction
    # forms (one float32 ulp, 9 of 700 rows of s here).
    exact = (0, 2, 3)
    for i, (got, want) in enumerate(zip(blocked, whole, strict=True)):
        if i in exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)


@pytest.mark.parametrize(
    "dtype", [jnp.bfloat16, pytest.param(jnp.float32, marks=pytest.mark.long)]
)
def test_no_float32_copy_of_the_logits_on_the_cpu(dtype):
    # Compiled only: [4096, 32768] logits, whose float32 copy is 512 MiB.
    x = jax.ShapeDtypeStruct((4096, 32768), dtype)
    y = jax.ShapeDtypeStruct((4096,), jnp.int32)
    # bf16 blocks are sliced from the 16-bit pattern of the logits (one copy
    # of the input's size); beside it, the blocks of 2**20 entries.
    allowed = (0 if dtype == jnp.float32 else 4096 * 32768 * 2) + (32 << 20)
    for fn in (metrics.ece, metrics.brier):
        compiled = (
            jax.jit(lambda z, y, fn=fn: fn(z, y, from_logits=True))
            .lower(x, y)
            .compile()
        )
        assert compiled.memory_analysis().temp_size_in_bytes < allowed
