"""summary_of_chunks: the metrics summary over chunks equals the in-memory summary.

Every case has the same N, K and chunk rows, so that the in-memory summary,
the per-chunk step (once per input dtype) and the row metrics compile once
for the file. Row metrics must be bit-identical; NLL and Brier are float32
sums added in another order (1e-6 relative); class-wise ECE is a sum of
|S_conf - S_correct| per bin, whose cancellation turns the sums' 1e-7
relative rounding into up to ~1e-6 of the value (1e-5 here).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from calib_jax import chunks, metrics, storage
from calib_jax.metrics import _streamed
from calib_jax.metrics._streamed import summary_of_chunks

# 480 does not divide 1000: the last chunk is padded. XLA:CPU computes the
# exponentials and row sums of arrays under about 4,800 entries on another
# code path, whose 1/s differs in the last ulp for a third of these rows
# (chunks of [400, 10] or fewer); chunks of [480, 10] and more, as every
# chunk of a large label space, take the path of the whole array.
N, K, ROWS = 1000, 10, 480
CUTS = (0, 1, 300, 700, N)  # item / shard boundaries, none on a chunk boundary


def _logits():
    """Logits as classifiers give them: top-label probabilities from ~0.3 to
    piled at exactly 1.0 (margin 40) and just below it (margin 17)."""
    rng = np.random.default_rng(23)
    z = (2.0 * rng.normal(size=(N, K))).astype(np.float32)
    top = rng.integers(0, K, N)
    z[np.arange(N), top] += rng.choice([0.0, 2.0, 6.0, 17.0, 40.0], N)
    labels = np.where(rng.random(N) < 0.8, top, rng.integers(0, K, N))
    return z, labels


LOGITS, LABELS = _logits()
PROBS = np.asarray(jax.nn.softmax(jnp.asarray(LOGITS), axis=-1))
BF16 = LOGITS.astype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def expected():
    return metrics.summary(PROBS, LABELS)


@pytest.fixture(scope="module")
def expected_bf16():
    return metrics.summary(BF16, LABELS, from_logits=True)


def _softmax64(x):
    z = np.asarray(x, np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _assert_equal(out, ref, probs=PROBS):
    assert list(out) == list(ref)
    for key in out:
        assert out[key].dtype == jnp.float32, key
        if key in _streamed.ROW_METRICS:
            assert float(out[key]) == float(ref[key]), key
    np.testing.assert_allclose(float(out["nll"]), float(ref["nll"]), rtol=1e-6)
    np.testing.assert_allclose(float(out["brier"]), float(ref["brier"]), rtol=1e-6)
    np.testing.assert_allclose(
        float(out["classwise_ece"]), float(ref["classwise_ece"]), rtol=1e-5
    )
    # The sums against float64 NumPy.
    p = np.asarray(probs, np.float64)
    p_label = p[np.arange(N), LABELS]
    nll = -np.mean(np.log(np.maximum(p_label, np.finfo(np.float32).tiny)))
    brier = np.mean(np.sum(p * p, axis=1) - 2 * p_label + 1)
    np.testing.assert_allclose(float(out["nll"]), nll, rtol=1e-6)
    np.testing.assert_allclose(float(out["brier"]), brier, rtol=1e-6)


def _pieces(x):
    return [(x[a:b], LABELS[a:b]) for a, b in itertools.pairwise(CUTS)]


@pytest.mark.long
def test_iterator_of_probs_pairs(expected):
    out = summary_of_chunks(iter(_pieces(PROBS)), chunk_rows=ROWS, progress_bar=False)
    _assert_equal(out, expected)
    # Piled at 1.0 and just below: the cases the row metrics must keep apart.
    conf = PROBS.max(axis=1)
    assert (conf == 1.0).sum() > 100 and ((conf < 1.0) & (conf > 1 - 1e-6)).sum() > 50


def test_glob_of_npz_shards(tmp_path, expected):
    for i, (x, y) in enumerate(_pieces(PROBS)):
        np.savez(tmp_path / f"val-{i}.npz", probs=x, labels=y)
    out = summary_of_chunks(
        str(tmp_path / "val-*.npz"), chunk_rows=ROWS, progress_bar=False
    )
    _assert_equal(out, expected)


def _write_npy_shards(directory, x, stem):
    paths = []
    for i, (a, b) in enumerate(itertools.pairwise(CUTS)):
        paths.append(str(directory / f"{stem}-{i}.npy"))
        np.save(paths[-1], x[a:b])
        np.save(str(directory / f"{stem}-{i}.labels.npy"), LABELS[a:b])
    return paths


@pytest.mark.long
def test_list_of_bf16_npy_shards_with_sibling_labels(tmp_path, expected_bf16):
    paths = _write_npy_shards(tmp_path, BF16, "logits")
    assert chunks.ChunkSource(paths).dtype == np.dtype(ml_dtypes.bfloat16)
    out = summary_of_chunks(
        paths, from_logits=True, chunk_rows=ROWS, progress_bar=False
    )
    _assert_equal(out, expected_bf16, _softmax64(BF16.astype(np.float32)))
    x = BF16.copy()
    x[305, 3] = np.nan  # row 5 of shard 2
    _write_npy_shards(tmp_path, x, "nan")
    with pytest.raises(ValueError) as err:
        summary_of_chunks(
            str(tmp_path / "nan-*.npy"),
            from_logits=True,
            chunk_rows=ROWS,
            progress_bar=False,
        )
    assert str(err.value) == (
        f"shard {str(tmp_path / 'nan-2.npy')!r} row 5 (chunk 0): logits contain NaN "
        "or inf (1 row(s) of the chunk); expected finite logits."
    )


@pytest.mark.long
def test_gs_glob_of_npz_shards(gcs_emulator, gcs_bucket, expected):
    root = storage.as_path(f"{gcs_bucket}/run/logits")
    for i, (x, y) in enumerate(_pieces(PROBS)):
        storage.save_npz(root / f"test-{i}.npz", probs=x, labels=y)
    out = summary_of_chunks(
        f"{gcs_bucket}/run/logits/test-*.npz", chunk_rows=ROWS, progress_bar=False
    )
    _assert_equal(out, expected)


def test_one_compile_over_many_chunks(expected):
    before = _streamed.chunk_step._cache_size()
    # 11 chunks of 96 rows, the last one 40 rows (padded); no class-wise
    # tables: a program of its own, compiled by this call alone.
    out = summary_of_chunks(
        iter([(PROBS, LABELS)]),
        names=("nll", "brier"),
        chunk_rows=96,
        progress_bar=False,
    )
    assert _streamed.chunk_step._cache_size() == before + 1
    np.testing.assert_allclose(float(out["nll"]), float(expected["nll"]), rtol=1e-6)
    assert list(out) == ["nll", "brier"]


def test_nan_probs_name_the_shard_and_row(tmp_path):
    x = PROBS.copy()
    x[305, 3] = np.nan  # row 5 of shard 2
    _write_npy_shards(tmp_path, x, "nan")
    with pytest.raises(ValueError) as err:
        summary_of_chunks(
            str(tmp_path / "nan-*.npy"), chunk_rows=ROWS, progress_bar=False
        )
    assert str(err.value) == (
        f"shard {str(tmp_path / 'nan-2.npy')!r} row 5 (chunk 0): probs contain NaN "
        "or inf; expected finite probabilities. If these are logits, pass "
        "from_logits=True."
    )


def test_probs_off_the_simplex_name_the_item_and_row():
    pieces = _pieces(PROBS.copy())
    pieces[2][0][7] *= 0.5  # row 7 of item 2 (a view of the copy)
    with pytest.raises(ValueError) as err:
        summary_of_chunks(iter(pieces), chunk_rows=ROWS, progress_bar=False)
    assert str(err.value) == (
        "item 2 of the iterable row 7 (chunk 0): rows of probs must sum to 1 "
        "(tolerance 1.0e-03); the row sums to 0.5. If these are logits, pass "
        "from_logits=True."
    )
    pieces = _pieces(PROBS.copy())
    pieces[3][0][250, :2] += np.float32([-0.25, 0.25])  # row 250 of item 3: chunk 1
    with pytest.raises(ValueError) as err:
        summary_of_chunks(iter(pieces), chunk_rows=ROWS, progress_bar=False)
    low = float(PROBS[950, 0] - np.float32(0.25))
    assert low < 0.0
    assert str(err.value) == (
        "item 3 of the iterable row 250 (chunk 1): probs must be probabilities in "
        f"[0, 1]; found {low:.4g}. If these are logits, pass from_logits=True."
    )


def test_logits_read_as_probs_and_bad_arguments(tmp_path):
    np.savez(tmp_path / "a.npz", logits=LOGITS, labels=LABELS)
    with pytest.raises(ValueError) as err:
        summary_of_chunks(str(tmp_path / "a.npz"))
    assert str(err.value).startswith(
        f"shard {str(tmp_path / 'a.npz')!r} has no array 'probs' (it has: logits, "
    )
    with pytest.raises(ValueError, match="^names has unknown metric"):
        summary_of_chunks(iter([]), names=("ecee",))
    with pytest.raises(ValueError, match="K = 1 class"):
        summary_of_chunks(iter([(np.ones((3, 1)), np.zeros(3, int))]))


@pytest.mark.long
def test_large_label_space_bf16_npy_shards(tmp_path):
    """K = 50,257 (a GPT-2 vocabulary) in bf16 .npy shards, chunks of 128 rows
    cut across 3 shards, against the in-memory summary of the logits
    (from_logits=True) and float64 NumPy for the sums."""
    n, k = 600, 50257
    rng = np.random.default_rng(5)
    z = rng.normal(size=(n, k)).astype(np.float32)
    top = rng.integers(0, k, n)
    z[np.arange(n), top] += rng.choice([4.0, 12.0, 30.0], n)
    labels = np.where(rng.random(n) < 0.7, top, rng.integers(0, k, n))
    x = z.astype(ml_dtypes.bfloat16)
    for i, (a, b) in enumerate([(0, 250), (250, 251), (251, n)]):
        np.save(tmp_path / f"v-{i}.npy", x[a:b])
        np.save(tmp_path / f"v-{i}.labels.npy", labels[a:b])
    out = summary_of_chunks(
        str(tmp_path / "v-*.npy"), from_logits=True, chunk_rows=128, progress_bar=False
    )
    ref = metrics.summary(x, labels, from_logits=True)
    for key in _streamed.ROW_METRICS:
        assert float(out[key]) == float(ref[key]), key
    for key in ("nll", "brier", "classwise_ece"):
        np.testing.assert_allclose(float(out[key]), float(ref[key]), rtol=1e-5)
    p = _softmax64(x.astype(np.float32))
    p_label = p[np.arange(n), labels]
    np.testing.assert_allclose(float(out["nll"]), -np.mean(np.log(p_label)), rtol=1e-5)
    brier = np.mean(np.sum(p * p, axis=1) - 2 * p_label + 1)
    np.testing.assert_allclose(float(out["brier"]), brier, rtol=1e-5)


# Compiles the chunk step on the small shards, resets the peak resident
# memory (VmHWM, /proc/self/clear_refs), runs on argv[2]'s shards and prints
# the new peak. Class-wise ECE, NLL and Brier only: no program compiled for
# the row count.
_PEAK = """
import sys
from calib_jax.metrics._streamed import summary_of_chunks
run = lambda p: summary_of_chunks(p, from_logits=True, chunk_rows=256,
    names=("classwise_ece", "nll", "brier"), progress_bar=False)
run(sys.argv[1])
open("/proc/self/clear_refs", "w").write("5")
out = run(sys.argv[2])
assert all(float(v) == float(v) for v in out.values())  # no NaN
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]) * 1024)
"""


def _peak_bytes(warm, pattern) -> int:
    env = dict(os.environ, JAX_PLATFORMS="cpu", CALIB_JAX_PROGRESS="0")
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, warm, pattern],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(run.stdout.split()[-1])


@pytest.mark.long
def test_peak_memory_does_not_grow_with_the_shards(tmp_path):
    """8x the rows in shards 8x as large (33 MB -> 268 MB of bf16 logits) add
    less than a quarter of the extra bytes to the peak resident memory of the
    run: the shards are read a chunk (256 rows, 8 MB) at a time."""
    k = 16384
    rng = np.random.default_rng(0)
    for name, n in (("small", 1024), ("large", 8192)):
        (tmp_path / name).mkdir()
        for i in range(2):
            z = rng.normal(size=(n // 2, k)).astype(ml_dtypes.bfloat16)
            np.save(tmp_path / name / f"l-{i}.npy", z)
            np.save(tmp_path / name / f"l-{i}.labels.npy", rng.integers(0, k, n // 2))
    small_glob = str(tmp_path / "small" / "l-*.npy")
    small = _peak_bytes(small_glob, small_glob)
    large = _peak_bytes(small_glob, str(tmp_path / "large" / "l-*.npy"))
    extra_data = (8192 - 1024) * k * 2
    assert large - small < extra_data / 4, (small, large)
