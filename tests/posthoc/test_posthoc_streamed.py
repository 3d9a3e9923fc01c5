"""posthoc.fit_of_chunks: temperature scaling over chunks equals the in-memory fit."""

from __future__ import annotations

import math

import _reference_batch
import _reference_posthoc
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from calib_jax import chunks, posthoc, progress
from calib_jax.posthoc import _streamed

N, K = 1000, 10
ROWS = 300  # chunk rows: 1000 = 3 * 300 + 100, the last chunk padded


def _logits(n=N, k=K, seed=0, dtype=np.float32):
    """Over-confident classifier logits: 85% of rows boosted on their label,
    the rest on another class; float32 confidences pile up just below 1."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    z = 2.0 * rng.standard_normal((n, k))
    right = rng.random(n) < 0.85
    top = np.where(right, labels, (labels + rng.integers(1, k, n)) % k)
    z[np.arange(n), top] += 7.0
    return z.astype(np.float32).astype(dtype), labels


def _pairs(x, labels):
    """Uneven pieces, none a multiple of ROWS."""
    n = len(labels)
    cuts = (0, 137, 2 * n // 3, n)
    return [(x[a:b], labels[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _save_npy(path, x, labels):
    np.save(path, x)
    np.save(str(path)[: -len(".npy")] + chunks.LABELS_SUFFIX, labels)


def _temperature(cal):
    return float(cal.params["temperature"])


@pytest.mark.long
def test_nll_from_an_iterable_equals_the_in_memory_fit():
    x, y = _logits()
    cal = posthoc.fit_of_chunks("ts", _pairs(x, y), chunk_rows=ROWS, progress_bar=False)
    ref = posthoc.fit("ts", x, y)
    assert cal.name == ref.name == "ts:nll"
    assert cal.params["temperature"].dtype == jnp.float32
    assert _temperature(cal) == pytest.approx(_temperature(ref), rel=1e-5)
    # The fitted T is the NLL's stationary point in float64 (central
    # difference in log T of the float64 reference).
    t, h = _temperature(cal), 1e-4
    slope = (
        _reference_posthoc.nll(x, y, t * math.exp(h))
        - _reference_posthoc.nll(x, y, t * math.exp(-h))
    ) / (2 * h)
    assert abs(slope) < 1e-5
    assert 1.0 < t < 20.0  # over-confident logits: T > 1


@pytest.mark.long
def test_sb_ece_from_bf16_npy_shards_equals_the_in_memory_fit(tmp_path):
    x, y = _logits(dtype=ml_dtypes.bfloat16)
    for i, (a, b) in enumerate(((0, 410), (410, 777), (777, N))):
        _save_npy(tmp_path / f"logits-{i:02d}.npy", x[a:b], y[a:b])
    cal = posthoc.fit_of_chunks(
        "ts:sb_ece", str(tmp_path / "logits-*.npy"), chunk_rows=ROWS, progress_bar=False
    )
    ref = posthoc.fit("ts:sb_ece", jnp.asarray(x), y)
    assert cal.name == ref.name == "ts:sb_ece"
    assert _temperature(cal) == pytest.approx(_temperature(ref), rel=1e-5)
    # The saved calibrator reads back and applies as the in-memory one.
    path = tmp_path / "ts.npz"
    cal.save(path)
    loaded = posthoc.load(path)
    assert loaded.name == "ts:sb_ece"
    np.testing.assert_allclose(
        loaded.apply(x[:5]), ref.apply(x[:5]), rtol=1e-5, atol=1e-6
    )


def _objective_at(kind, p, t, x, y):
    """(value, d/du) of the streamed SB-ECE objective at T = ``t``."""
    bar = progress.bar(None, desc="test", unit="pass", enabled=False)
    source = chunks.as_source(_pairs(x, y), chunk_rows=ROWS, progress_bar=False)
    passes = _streamed._Passes(source, desc="test", bar=bar)
    _streamed._nll_objective(passes)(jnp.zeros((), jnp.float32))  # first pass
    evaluate = _streamed._sb_ece_objective(
        passes, num_bins=15, sb_temperature=jnp.float32(0.01), p=p, kind=kind
    )
    value, slope = evaluate(jnp.asarray(math.log(t), jnp.float32))
    return float(value), float(slope), passes.passes - 1


@pytest.mark.parametrize(
    ("kind", "p", "passes"),
    [
        ("lb", 2.0, 1),
        ("bin", 2.0, 1),
        pytest.param("lb", 1.0, 2, marks=pytest.mark.long),
    ],
)
def test_sb_ece_of_merged_chunks_equals_the_float64_reference(kind, p, passes):
    x, y = _logits(n=400, seed=1)
    t, h = 1.7, 1e-3

    def ref(temp):
        return _reference_batch.ref_sb_ece(
            x.astype(np.float64) / temp,
            y,
            num_bins=15,
            temperature=0.01,
            p=p,
            kind=kind,
        )

    value, slope, used = _objective_at(kind, p, t, x, y)
    assert used == passes
    assert value == pytest.approx(ref(t), rel=1e-5)
    fd = (ref(t * math.exp(h)) - ref(t * math.exp(-h))) / (2 * h)
    assert slope == pytest.approx(fd, rel=2e-3, abs=1e-6)


@pytest.mark.long
@pytest.mark.parametrize(
    ("name", "dtype", "options"),
    [
        ("ts:nll", ml_dtypes.bfloat16, {}),
        ("ts:sb_ece", np.float32, {}),
        ("ts:sb_ece", np.float32, {"sb_kind": "bin"}),
        ("ts:sb_ece", ml_dtypes.bfloat16, {"p": 1.0}),
    ],
)
def test_npz_shards_equal_the_in_memory_fit(tmp_path, name, dtype, options):
    x, y = _logits(seed=2, dtype=dtype)
    paths = []
    for i, (a, b) in enumerate(((0, 333), (333, 334), (334, N))):
        paths.append(str(tmp_path / f"val-{i}.npz"))
        np.savez(paths[-1], logits=x[a:b], labels=y[a:b])
    cal = posthoc.fit_of_chunks(
        name, paths, chunk_rows=ROWS, progress_bar=False, **options
    )
    ref = posthoc.fit(name, jnp.asarray(x), y, **options)
    assert _temperature(cal) == pytest.approx(_temperature(ref), rel=1e-5)


def _one_line_error(match, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as err:
        posthoc.fit_of_chunks(*args, progress_bar=False, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_shards_are_one_line_errors_naming_the_shard(tmp_path):
    x, y = _logits(n=40)
    _save_npy(tmp_path / "a.npy", x[:20], y[:20])
    bad = y[20:].copy()
    bad[3] = K  # outside [0, K)
    _save_npy(tmp_path / "b.npy", x[20:], bad)
    msg = _one_line_error(r"labels must lie in \[0, K\)", "ts", str(tmp_path / "*.npy"))
    assert "b.npy" in msg and "row 3" in msg
    nan = x[20:].copy()
    nan[5, 2] = np.nan
    _save_npy(tmp_path / "b.npy", nan, y[20:])
    msg = _one_line_error(
        "NaN or inf", "ts:sb_ece", str(tmp_path / "*.npy"), chunk_rows=16
    )
    assert "b.npy" in msg and "row 5" in msg
    _save_npy(tmp_path / "b.npy", x[20:, :4], y[20:] % 4)
    msg = _one_line_error("classes", "ts", str(tmp_path / "*.npy"))
    assert "b.npy" in msg
    _one_line_error("matches no file", "ts", str(tmp_path / "none-*.npy"))


def test_bad_names_options_and_one_shot_iterators_are_refused():
    x, y = _logits(n=40)
    _one_line_error("posthoc.fit", "ts:hb_ece", [(x, y)])
    _one_line_error("posthoc.fit", "ets", [(x, y)])
    _one_line_error("iterator", "ts", iter([(x, y)]))
    _one_line_error("sb_kind", "ts:sb_ece", [(x, y)], sb_kind="soft")
    _one_line_error("K >= 2", "ts", [(x[:, :1], y * 0)])
