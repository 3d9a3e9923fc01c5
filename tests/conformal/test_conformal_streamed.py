"""conformal.fit_of_chunks: the in-memory fit's thresholds, bit for bit, from chunks."""

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from calib_jax import conformal

KEY = jax.random.key(7)


def _logits(n, k, seed):
    """Logits of a trained classifier: a third of the rows so confident that
    their float32 softmax is piled at 1.0 or just below it."""
    rng = np.random.default_rng(seed)
    z = 2.0 * rng.standard_normal((n, k))
    labels = rng.integers(0, k, n)
    sure = rng.random(n) < 0.35
    z[sure, labels[sure]] += rng.uniform(15.0, 40.0, sure.sum())
    return z.astype(np.float32), labels


Z, Y = _logits(1300, 12, 0)  # chunks of 700 rows: 8400 entries, N not divisible
PAIRS = [(Z[:333], Y[:333]), (Z[333:1000], Y[333:1000]), (Z[1000:], Y[1000:])]


def _same(a, b):
    assert type(a) is type(b)
    np.testing.assert_array_equal(np.asarray(a.qhat), np.asarray(b.qhat))
    assert (a.method, a.randomized, a.num_calibration, a.num_classes) == (
        b.method,
        b.randomized,
        b.num_calibration,
        b.num_classes,
    )
    if isinstance(a, conformal.MondrianPredictor):
        np.testing.assert_array_equal(a.class_counts, b.class_counts)


# make test runs one case; the whole matrix runs in make test-slow.
FAST = (("aps", KEY, False),)
CASES = [
    c if c in FAST else pytest.param(*c, marks=pytest.mark.long)
    for c in itertools.product(("thr", "aps", "raps"), (None, KEY), (False, True))
]


@pytest.mark.long
@pytest.mark.parametrize(("name", "key", "mondrian"), CASES)
def test_iterable_equals_in_memory(name, key, mondrian):
    kw = {"mondrian": True, "absent": "marginal"} if mondrian else {}
    want = conformal.fit(name, Z, Y, alpha=0.1, key=key, **kw)
    got = conformal.fit_of_chunks(
        name, PAIRS, alpha=0.1, key=key, chunk_rows=700, progress_bar=False, **kw
    )
    _same(got, want)
    if key is not None and name != "thr":
        # The uniforms are the in-memory draw's, row for row.
        rows = np.arange(200)
        np.testing.assert_array_equal(
            got.scores(Z[rows], Y[rows], key), want.scores(Z[rows], Y[rows], key)
        )


@pytest.mark.long
def test_raps_options_and_allow_empty():
    kw = {"lam": 0.05, "k_reg": 3, "allow_empty": False}
    want = conformal.fit("raps", Z, Y, alpha=0.05, key=KEY, **kw)
    got = conformal.fit_of_chunks(
        "raps",
        iter(PAIRS),
        alpha=0.05,
        key=KEY,
        chunk_rows=900,
        progress_bar=False,
        **kw,
    )
    _same(got, want)
    assert (got.lam, got.k_reg, got.allow_empty) == (want.lam, want.k_reg, False)
    np.testing.assert_array_equal(
        got.predict_sets(Z[:50], key=KEY), want.predict_sets(Z[:50], key=KEY)
    )


@pytest.mark.long
def test_small_input_in_tiny_chunks():
    """Under 8192 entries in all, chunks of 7 rows: still the in-memory fit."""
    z, y = _logits(120, 6, 1)
    for name, key in (("aps", KEY),):
        want = conformal.fit(name, z, y, alpha=0.2, key=key)
        got = conformal.fit_of_chunks(
            name, [(z, y)], alpha=0.2, key=key, chunk_rows=7, progress_bar=False
        )
        _same(got, want)


def _write_npy(path, x, labels):
    np.save(path, x)
    np.save(str(path)[: -len(".npy")] + ".labels.npy", labels)


def test_bf16_shards_equal_in_memory(tmp_path):
    """bf16 logits in .npy and .npz shards, a glob and a list, keyed APS."""
    z, y = _logits(2100, 40, 2)
    zb = z.astype(ml_dtypes.bfloat16)
    bounds = (0, 700, 1500, 2100)
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        _write_npy(tmp_path / f"cal-{i}.npy", zb[a:b], y[a:b])
        np.savez(tmp_path / f"cal-{i}.npz", logits=zb[a:b], labels=y[a:b])
    want = conformal.fit("aps", jnp.asarray(zb), y, alpha=0.1, key=KEY)
    mond = conformal.fit("thr", jnp.asarray(zb), y, alpha=0.1, mondrian=True)
    npz = sorted(str(p) for p in tmp_path.glob("*.npz"))
    for source in (str(tmp_path / "cal-*.npy"), npz):
        got = conformal.fit_of_chunks(
            "aps", source, alpha=0.1, key=KEY, chunk_rows=400, progress_bar=False
        )
        _same(got, want)
        got = conformal.fit_of_chunks(
            "thr", source, alpha=0.1, mondrian=True, chunk_rows=400, progress_bar=False
        )
        _same(got, mond)


LOW = [
    pytest.param(jnp.bfloat16, "raps", {}, marks=pytest.mark.long),
    pytest.param(jnp.float16, "raps", {}, marks=pytest.mark.long),
    pytest.param(
        jnp.bfloat16,
        "aps",
        {"mondrian": True, "absent": "full"},
        marks=pytest.mark.long,
    ),
]


@pytest.mark.parametrize(("dtype", "name", "kw"), LOW)
def test_fit_and_sets_accept_low_precision_logits(dtype, name, kw):
    """bf16/fp16 logits are upcast: the float32 copy's predictor and sets."""
    z = jnp.asarray(Z[:600]).astype(dtype)
    up = z.astype(jnp.float32)
    low = conformal.fit(name, z, Y[:600], alpha=0.1, key=KEY, **kw)
    ref = conformal.fit(name, up, Y[:600], alpha=0.1, key=KEY, **kw)
    np.testing.assert_array_equal(low.qhat, ref.qhat)
    sets = low.predict_sets(z, key=KEY)
    np.testing.assert_array_equal(sets, ref.predict_sets(up, key=KEY))
    # The guarantee's event: a label is in its set exactly when its
    # score is at most its threshold.
    qhat = low.qhat[Y[:600]] if low.qhat.ndim else low.qhat
    inside = np.asarray(sets)[np.arange(600), Y[:600]]
    np.testing.assert_array_equal(inside, low.scores(z, Y[:600], KEY) <= qhat)


def test_bad_input_one_line(tmp_path):
    z, y = Z[:500], Y[:500]
    bad = z.copy()
    bad[423, 4] = np.nan
    _write_npy(tmp_path / "a.npy", z[:300], y[:300])
    _write_npy(tmp_path / "b.npy", bad[300:], y[300:])
    with pytest.raises(
        ValueError, match=r"^shard '.*b\.npy' row 123 \(chunk \d\): logits contain NaN"
    ) as err:
        conformal.fit_of_chunks(
            "aps",
            str(tmp_path / "*.npy"),
            alpha=0.1,
            chunk_rows=700,
            progress_bar=False,
        )
    assert "\n" not in str(err.value)
    y_bad = y.copy()
    y_bad[450] = 12
    cases = [
        (
            [(z, y_bad)],
            {},
            r"^item 0 of the iterable: labels must lie in \[0, K\) = \[0, 12\); found 12 at row 450",
        ),
        (
            [(z, y), (z[:, :5], y)],
            {},
            r"^item 1 of the iterable has K = 5 classes; expected K = 12",
        ),
        (str(tmp_path / "none-*.npy"), {}, r"^shards glob .* matches no file"),
    ]
    _raise_one_line(z, y, cases)
    with pytest.raises(ValueError, match=r"^unknown conformal method 'lac'"):
        conformal.fit_of_chunks("lac", [(z, y)], alpha=0.1)
    with pytest.raises(ValueError, match=r"^alpha must lie in \(0, 1\)"):
        conformal.fit_of_chunks("thr", [(z, y)], alpha=1.5)


def _raise_one_line(z, y, cases):
    for source, kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as err:
            conformal.fit_of_chunks(
                "aps", source, alpha=0.1, chunk_rows=700, progress_bar=False, **kw
            )
        assert "\n" not in str(err.value)


@pytest.mark.long
def test_bad_values_one_line():
    """What only the scored values show: still one line, before a result."""
    z, y = Z[:500], Y[:500]
    cases = [
        ([(z[:5], y[:5])], {}, r"^calibration set too small for alpha=0.1: n = 5"),
        ([(z, y)], {"lam": 0.1}, r"^unknown option for conformal method 'aps': lam"),
        (
            [(z, y)],
            {"absent": "full"},
            r"^absent='full' applies to Mondrian predictors only",
        ),
        (
            [(z[:, :1], y * 0)],
            {},
            r"^item 0 of the iterable row 0 \(chunk 0\): the logits have K = 1",
        ),
        (
            [(z, np.minimum(y, 10))],
            {"mondrian": True},
            r"^class 11 is absent from the calibration set",
        ),
    ]
    _raise_one_line(z, y, cases)
    # Uniforms drawn as rows arrive need prefix-stable bits.
    rbg = jax.random.key(0, impl="rbg")
    with pytest.raises(
        ValueError, match=r"^a randomised fit over an iterable .* rbg key"
    ):
        conformal.fit_of_chunks(
            "raps", [(z, y)], alpha=0.1, key=rbg, progress_bar=False
        )
