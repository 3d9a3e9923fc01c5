"""calib_jax.chunks: chunk sources over arrays and .npz/.npy shards (local, gs://)."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

from calib_jax import chunks, storage

K = 6


def _data(n, k=K, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, k)).astype(dtype), rng.integers(0, k, n)


def _rows(source):
    parts = list(source)
    return (
        parts,
        np.concatenate([c.x for c in parts]),
        np.concatenate([c.labels for c in parts]),
    )


def _save_npy(path, x, labels):
    np.save(path, x)
    np.save(str(path)[: -len(".npy")] + chunks.LABELS_SUFFIX, labels)


def test_pieces_are_cut_and_joined_into_chunks_of_chunk_rows():
    x, y = _data(23)
    pieces = [
        (x[:1], y[:1]),
        (x[1:12], y[1:12]),
        (x[12:13], y[12:13]),
        (x[13:], y[13:]),
    ]
    source = chunks.ChunkSource(iter(pieces), chunk_rows=5, progress_bar=False)
    parts, xs, ys = _rows(source)
    assert [c.x.shape[0] for c in parts] == [5, 5, 5, 5, 3]
    assert [c.index for c in parts] == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(xs, x)
    np.testing.assert_array_equal(ys, y)
    # Chunk 2 holds rows 10..14: the last 2 rows of item 1, item 2, 2 rows of item 3.
    assert parts[2].spans == (
        chunks.Span("item 1 of the iterable", 0, 2, 9),
        chunks.Span("item 2 of the iterable", 2, 3, 0),
        chunks.Span("item 3 of the iterable", 3, 5, 0),
    )
    assert parts[2].where(4) == "item 3 of the iterable row 1 (chunk 2)"
    assert (source.num_classes, source.dtype, source.num_rows) == (K, np.float32, None)


def test_npy_shards_are_memory_mapped_bf16_blocks(tmp_path):
    x, y = _data(10)
    bf16 = x.astype(ml_dtypes.bfloat16)
    _save_npy(tmp_path / "s-0.npy", bf16[:7], y[:7])
    _save_npy(tmp_path / "s-1.npy", bf16[7:], y[7:])
    assert np.load(tmp_path / "s-0.npy").dtype == np.dtype("V2")  # what np.save wrote
    source = chunks.ChunkSource(
        str(tmp_path / "s-*.npy"), chunk_rows=3, progress_bar=False
    )
    assert (source.num_rows, source.num_chunks, source.dtype) == (10, 4, bf16.dtype)
    parts, xs, ys = _rows(source)
    # Blocks of one shard are views of its memory map (nothing else read);
    # chunk 2 joins row 6 of s-0 with rows 0..1 of s-1.
    assert [type(c.x) for c in parts] == [np.memmap, np.memmap, np.ndarray, np.memmap]
    assert xs.dtype == bf16.dtype
    np.testing.assert_array_equal(xs.view(np.uint16), bf16.view(np.uint16))
    np.testing.assert_array_equal(ys, y)
    assert parts[2].where(1).startswith(f"shard {str(tmp_path / 's-1.npy')!r} row 0")


def test_npz_shards_of_probs_and_a_list_of_paths(tmp_path):
    x, y = _data(9)
    paths = []
    for i, (lo, hi) in enumerate([(0, 4), (4, 9)]):
        paths.append(tmp_path / f"p{i}.npz")
        np.savez(paths[-1], probs=x[lo:hi], labels=y[lo:hi])
    source = chunks.ChunkSource(paths, chunk_rows=4, progress_bar=False)
    assert source.key == "probs"
    parts, xs, ys = _rows(source)
    assert [c.x.shape[0] for c in parts] == [4, 4, 1]
    np.testing.assert_array_equal(xs, x)
    np.testing.assert_array_equal(ys, y)


@pytest.mark.long
def test_gs_glob_of_npy_shards_reads_row_ranges(gcs_emulator, gcs_bucket):
    x, y = _data(11)
    bf16 = x.astype(ml_dtypes.bfloat16)
    root = storage.as_path(f"{gcs_bucket}/logits")
    for i, (lo, hi) in enumerate([(0, 6), (6, 11)]):
        for suffix, arr in ((".npy", bf16[lo:hi]), (chunks.LABELS_SUFFIX, y[lo:hi])):
            buf = io.BytesIO()
            np.save(buf, arr)
            storage.write_bytes(root / f"test-{i}{suffix}", buf.getvalue())
    source = chunks.ChunkSource(
        f"{gcs_bucket}/logits/test-*.npy", chunk_rows=4, progress_bar=False
    )
    assert (source.num_rows, source.dtype) == (11, bf16.dtype)
    parts, xs, ys = _rows(source)
    assert [c.x.shape[0] for c in parts] == [4, 4, 3]
    np.testing.assert_array_equal(xs.view(np.uint16), bf16.view(np.uint16))
    np.testing.assert_array_equal(ys, y)


def test_progress_bar_over_chunks(progress_shown, capsys, tmp_path):
    x, y = _data(7)
    np.savez(tmp_path / "a.npz", logits=x, labels=y)
    list(chunks.ChunkSource(str(tmp_path / "a.npz"), chunk_rows=3, desc="scan"))
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("scan: 100%|") and "| 3/3 [" in last  # total known: ETA
    list(chunks.ChunkSource(iter([(x, y)]), chunk_rows=3, desc="scan"))
    assert capsys.readouterr().err.splitlines()[-1].startswith("scan: 3chunk [")


# ---- bad input: one line naming the shard, the argument and what was expected ----


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_glob_that_matches_nothing(tmp_path):
    (tmp_path / "a.labels.npy").write_bytes(b"")  # labels files are not shards
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "*.npy"))
    assert _one_line(err) == (
        f"shards glob {str(tmp_path / '*.npy')!r} matches no file: expected .npz "
        "or .npy shards of scores and labels."
    )


@pytest.mark.parametrize(
    "second, expected",
    [
        (_data(3, k=K + 1), f"has K = {K + 1} classes; expected K = {K} as in shard"),
        (_data(3, dtype=np.float16), "has dtype float16; expected float32 as in shard"),
    ],
)
def test_shards_whose_classes_or_dtypes_disagree(tmp_path, second, expected):
    np.savez(tmp_path / "a.npz", logits=_data(3)[0], labels=_data(3)[1])
    np.savez(tmp_path / "b.npz", logits=second[0], labels=second[1])
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "*.npz"))
    text = _one_line(err)
    assert text.startswith(f"shard {str(tmp_path / 'b.npz')!r} {expected}")
    assert str(tmp_path / "a.npz") in text


def test_labels_outside_the_classes_name_the_shard_and_row(tmp_path):
    x, y = _data(8)
    y[6] = K
    np.savez(tmp_path / "a.npz", logits=x[:4], labels=y[:4])
    np.savez(tmp_path / "b.npz", logits=x[4:], labels=y[4:])
    with pytest.raises(ValueError) as err:
        list(chunks.ChunkSource(str(tmp_path / "*.npz"), progress_bar=False))
    assert _one_line(err) == (
        f"shard {str(tmp_path / 'b.npz')!r}: labels must lie in [0, K) = [0, {K}); "
        "found 6 at row 2 (1 label(s) out of range)."
    )


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_nonfinite_scores_name_the_shard_and_row(tmp_path, dtype):
    x, y = _data(9)
    x[7, 2] = np.inf if dtype is np.float32 else np.nan
    _save_npy(tmp_path / "a.npy", x.astype(dtype), y)
    source = chunks.ChunkSource(
        [str(tmp_path / "a.npy")], chunk_rows=4, progress_bar=False
    )
    with pytest.raises(ValueError) as err:
        list(source)
    assert _one_line(err) == (
        f"shard {str(tmp_path / 'a.npy')!r}: the scores contain NaN or inf at row 7; "
        "expected finite values."
    )
    # Bitwise bf16 test against np.isfinite of its float32 values.
    z = np.array([[0.0, np.inf, -np.inf, np.nan, 1e38, -3.0]], np.float32)
    got = [chunks.nonfinite_row(z[:, [j]].astype(ml_dtypes.bfloat16)) for j in range(6)]
    assert got == [-1, 0, 0, 0, -1, -1]


def test_labels_and_rows_of_different_lengths(tmp_path):
    x, y = _data(5)
    with pytest.raises(ValueError) as err:
        list(chunks.ChunkSource([(x, y), (x, y[:4])], progress_bar=False))
    assert _one_line(err) == (
        "item 1 of the iterable: labels must be [n] = [5] (one per row of x), got "
        "shape (4,)."
    )
    _save_npy(tmp_path / "a.npy", x, y[:3])  # caught from the headers
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "a.npy"))
    assert _one_line(err).startswith(
        f"shard {str(tmp_path / 'a.npy')!r}: labels must be [n] = [5]"
    )


def test_missing_labels_file_of_an_npy_shard(tmp_path):
    np.save(tmp_path / "a.npy", _data(3)[0])
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "*.npy"))
    assert _one_line(err) == (
        f"shard {str(tmp_path / 'a.npy')!r} has no labels file: expected its labels "
        f"[n] in {str(tmp_path / 'a.labels.npy')!r} (<stem>.labels.npy beside each "
        ".npy shard)."
    )


def test_npz_without_the_key_and_an_empty_source(tmp_path):
    np.savez(tmp_path / "a.npz", probs=_data(3)[0], labels=_data(3)[1])
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "a.npz"), key="logits")
    assert _one_line(err) == (
        f"shard {str(tmp_path / 'a.npz')!r} has no array 'logits' (it has: probs, "
        "labels); a shard holds 'logits' [n, K] and labels [n]."
    )
    with pytest.raises(ValueError, match="^the source holds no rows"):
        list(chunks.ChunkSource(iter([]), progress_bar=False))


def test_missing_shard_other_suffix_and_other_source(tmp_path):
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource([str(tmp_path / "gone.npz")])
    assert _one_line(err) == f"shard {str(tmp_path / 'gone.npz')!r} does not exist."
    (tmp_path / "a.csv").write_text("0.5,0.5\n")
    with pytest.raises(ValueError) as err:
        chunks.ChunkSource(str(tmp_path / "a.*"))
    assert _one_line(err).startswith(
        f"shard {str(tmp_path / 'a.csv')!r} is neither .npz nor .npy"
    )
    with pytest.raises(ValueError, match="^source must be an iterable of"):
        chunks.ChunkSource(42)
    with pytest.raises(ValueError, match="^chunk_rows must be a positive int"):
        chunks.ChunkSource([], chunk_rows=0)
