"""calib_jax.storage: path parsing, whole-file writes and .npy/.npz I/O, local and gs://.

gs:// cases run against the GCS API emulator of tests/_gcs.py; the bucket's
content is checked over the emulator's HTTP API, not through the code tested.
"""

from __future__ import annotations

import errno
import io
import os
import threading

import _gcs
import numpy as np
import pytest
from etils import epath

from calib_jax import storage

RNG = np.random.default_rng(0)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text, text
    return text


def _bucket(url: str) -> str:
    return url[len("gs://") :]


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text, remote",
    [
        ("runs/a", "runs/a", False),
        ("/tmp/x/../y", "/tmp/x/../y", False),
        ("run:1/x", "run:1/x", False),  # a colon in a local name is fine
        ("gs://bkt/run", "gs://bkt/run", True),
        ("gs://bkt", "gs://bkt", True),
        ("GS://bkt/run/", "gs://bkt/run", True),
        ("gs://my.bucket_1-a/x/y.npz", "gs://my.bucket_1-a/x/y.npz", True),
        ("s3://b/k", "s3://b/k", True),
    ],
)
def test_as_path_accepts_local_paths_and_urls(value, text, remote):
    path = storage.as_path(value)
    assert isinstance(path, epath.Path)
    assert os.fspath(path) == text
    assert storage.is_remote(path) is remote


def test_as_path_keeps_epath_and_pathlib_paths(tmp_path):
    assert os.fspath(storage.as_path(tmp_path / "a")) == os.fspath(tmp_path / "a")
    gs = epath.Path("gs://bkt/a")
    assert storage.as_path(gs) is gs  # parsed where it entered: passed on as is


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "--workdir is empty"),
        ("gs://", "it names no bucket"),
        ("gs:///run", "it names no bucket"),
        ("gs:/bucket/run", "a URL needs two slashes, gs://<bucket>/<path>"),
        ("gs:bucket/run", "would be a local directory named 'gs:'"),
        ("s3:/b/k", "a URL needs two slashes, s3://"),
        ("gcs://bucket/run", "unsupported scheme gcs:// (write gs://"),
        ("ftp://host/run", "unsupported scheme ftp://"),
        ("gs://Bucket/run", "'Bucket' is not a GCS bucket name"),
        ("gs://ab/run", "'ab' is not a GCS bucket name"),
        ("gs://-ab/run", "'-ab' is not a GCS bucket name"),
        ("gs://" + "a" * 64 + "/run", "is not a GCS bucket name"),
        ("gs://a b/run", "is not a GCS bucket name"),
    ],
)
def test_as_path_rejects_malformed_paths_in_one_line(value, message):
    with pytest.raises(ValueError) as err:
        storage.as_path(value, what="--workdir")
    text = _one_line(err.value)
    assert message in text
    if value:
        assert f"--workdir {value!r}" in text


def test_absolute_leaves_urls_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.fspath(storage.absolute("rel/x")) == os.fspath(tmp_path / "rel" / "x")
    # epath's own absolute() would prefix the working directory.
    assert os.fspath(storage.absolute("gs://bkt/run")) == "gs://bkt/run"


# ---------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------


def test_write_text_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.json"
    storage.write_text(path, "first\n")
    storage.write_text(path, "second\n")
    assert path.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    with pytest.raises(FileExistsError):
        storage.write_text(path, "third\n", exclusive=True)
    assert path.read_text() == "second\n"
    storage.write_text(tmp_path / "new.json", "x", exclusive=True)
    assert (tmp_path / "new.json").read_text() == "x"
    with pytest.raises(FileNotFoundError):
        storage.write_text(tmp_path / "missing" / "a.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "new.json"]


def test_append_and_make_dirs_local(tmp_path):
    path = tmp_path / "a" / "b" / "log.jsonl"
    storage.make_dirs(path.parent)
    for i in range(3):
        storage.append_text(path, f"{i}\n")
    assert path.read_text() == "0\n1\n2\n"


def test_read_jsonl_drops_a_line_cut_short_and_names_a_bad_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 0.5}\n\n{"step": 2}\n{"step": 3')
    assert storage.read_jsonl(str(path)) == [{"step": 1, "x": 0.5}, {"step": 2}]
    path.write_text('{"step": 3}')  # even a whole object: its newline is missing
    assert storage.read_jsonl(path) == []
    path.write_text("")
    assert storage.read_jsonl(path) == []
    for bad in ('{"step": 1}\n{"step": \n{"step": 3}\n', '{"step": 1}\n[2]\n'):
        path.write_text(bad)
        with pytest.raises(ValueError) as err:
            storage.read_jsonl(path)
        assert str(err.value) == f"{path}: line 2 is not a JSON object record."


def _npy_bytes(array: np.ndarray, version=None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


ARRAYS = {
    "c_order": RNG.integers(0, 256, (10, 4, 3, 2)).astype(np.uint8),
    "fortran": np.asfortranarray(RNG.normal(size=(9, 5))),
    "labels": RNG.integers(0, 100, 10).astype(np.int64),
}
SLICES = [(0, None), (0, 5), (3, 7), (7, None), (8, 100), (12, None), (6, 2)]


def _check_npy(directory: epath.Path, version=None) -> None:
    for name, array in ARRAYS.items():
        path = directory / f"{name}.npy"
        storage.write_bytes(path, _npy_bytes(array, version))
        header = storage.read_npy_header(path)
        assert header.shape == array.shape and header.dtype == array.dtype
        assert header.fortran_order == (name == "fortran")
        for start, stop in SLICES:
            got = storage.load_npy(path, start=start, stop=stop)
            want = array[start:stop]
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            assert not got.flags.writeable


@pytest.mark.parametrize("version", [None, (2, 0)])
def test_npy_rows_local_are_memory_mapped(tmp_path, version):
    _check_npy(epath.Path(tmp_path), version)
    assert isinstance(storage.load_npy(tmp_path / "c_order.npy", start=2), np.memmap)


def test_npz_round_trip_local(tmp_path):
    logits = RNG.normal(size=(7, 3)).astype(np.float32)
    labels = RNG.integers(0, 3, 7)
    storage.save_npz(tmp_path / "val.npz", logits=logits, labels=labels)
    got = storage.load_npz(tmp_path / "val.npz")
    assert sorted(got) == ["labels", "logits"]
    np.testing.assert_array_equal(got["logits"], logits)
    np.testing.assert_array_equal(got["labels"], labels)
    with np.load(tmp_path / "val.npz") as f:  # a plain np.savez archive
        np.testing.assert_array_equal(f["logits"], logits)


def test_move_tree_local(tmp_path):
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "f.txt").write_text("x")
    storage.move_tree(tmp_path / "src", tmp_path / "dst")
    assert not (tmp_path / "src").exists()
    assert (tmp_path / "dst" / "d" / "f.txt").read_text() == "x"


def test_local_paths_are_not_probed(tmp_path):
    storage.check_reachable(tmp_path / "does" / "not" / "exist")
    assert not (tmp_path / "does").exists()


# ---------------------------------------------------------------------------
# gs:// on the emulator
# ---------------------------------------------------------------------------


def test_gs_whole_writes_appends_and_npz(gcs_emulator, gcs_bucket):
    bucket = _bucket(gcs_bucket)
    root = storage.as_path(f"{gcs_bucket}/run")
    storage.make_dirs(root / "logits")  # no directories in a bucket: no object
    assert gcs_emulator.objects(bucket) == []
    storage.write_text(root / "config.json", '{"a": 1}\n')
    storage.write_text(root / "config.json", '{"a": 2}\n')
    with pytest.raises(FileExistsError):
        storage.write_text(root / "config.json", "x", exclusive=True)
    for i in range(3):  # gcsfs alone would overwrite on mode 'a'
        storage.append_text(root / "metrics.jsonl", f'{{"step": {i}}}\n')
    logits = RNG.normal(size=(11, 4)).astype(np.float32)
    labels = RNG.integers(0, 4, 11).astype(np.int32)
    storage.save_npz(root / "logits" / "test.npz", logits=logits, labels=labels)

    assert gcs_emulator.objects(bucket) == [
        "run/config.json",
        "run/logits/test.npz",
        "run/metrics.jsonl",
    ]
    assert gcs_emulator.read(bucket, "run/config.json") == b'{"a": 2}\n'
    assert gcs_emulator.read(bucket, "run/metrics.jsonl") == (
        b'{"step": 0}\n{"step": 1}\n{"step": 2}\n'
    )
    rows = storage.read_jsonl(f"{gcs_bucket}/run/metrics.jsonl")
    assert rows == [{"step": i} for i in range(3)]
    with np.load(io.BytesIO(gcs_emulator.read(bucket, "run/logits/test.npz"))) as f:
        np.testing.assert_array_equal(f["logits"], logits)
    got = storage.load_npz(root / "logits" / "test.npz")
    np.testing.assert_array_equal(got["logits"], logits)
    np.testing.assert_array_equal(got["labels"], labels)


@pytest.mark.parametrize("version", [None, (2, 0)])
def test_gs_npy_reads_rows(gcs_emulator, gcs_bucket, version):
    _check_npy(storage.as_path(f"{gcs_bucket}/c100c"), version)


def test_gs_move_tree_copies_then_deletes(gcs_emulator, gcs_bucket):
    bucket = _bucket(gcs_bucket)
    root = storage.as_path(gcs_bucket)
    storage.write_text(root / "ckpt" / "30" / "a.txt", "a")
    storage.write_bytes(root / "ckpt" / "30" / "d" / "0.bin", b"\x00\x01")
    storage.write_text(root / "ckpt" / "20" / "a.txt", "kept")
    storage.move_tree(root / "ckpt" / "30", root / "aside" / "30")
    assert gcs_emulator.objects(bucket) == [
        "aside/30/a.txt",
        "aside/30/d/0.bin",
        "ckpt/20/a.txt",
    ]
    assert gcs_emulator.read(bucket, "aside/30/d/0.bin") == b"\x00\x01"
    with pytest.raises(FileExistsError):
        storage.move_tree(root / "ckpt" / "20", root / "aside" / "30")


def test_check_reachable_names_a_missing_bucket(gcs_emulator, gcs_bucket, capfd):
    storage.check_reachable(f"{gcs_bucket}/run", what="--workdir")
    before = gcs_emulator.buckets()
    with pytest.raises(ValueError) as err:
        storage.check_reachable("gs://no-such-bucket/run", what="--workdir")
    text = _one_line(err.value)
    assert text.startswith(
        "--workdir gs://no-such-bucket/run: bucket gs://no-such-bucket"
    )
    assert "does not exist" in text
    # make_dirs never creates a bucket (gcsfs's makedirs would).
    storage.make_dirs("gs://no-such-bucket/run/logits")
    assert gcs_emulator.buckets() == before
    assert capfd.readouterr().err == ""


def test_check_reachable_gives_up_on_a_silent_endpoint(
    gcs_emulator, monkeypatch, capfd
):
    dead = f"http://127.0.0.1:{_gcs.free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)
    with pytest.raises(ValueError) as err:
        storage.check_reachable("gs://some-bucket/run", what="--workdir", timeout=2.0)
    text = _one_line(err.value)
    # The bound ended the call: the client alone retries for about a minute
    # and then fails with an error of its own ("cannot reach bucket").
    assert text.startswith("--workdir gs://some-bucket/run: no answer about bucket")
    assert "within 2 s" in text
    assert capfd.readouterr().err == ""  # the client's retry log is silenced


# ---------------------------------------------------------------------------
# Whole-file writes under failure, unreadable archives, the reachability deadline
# ---------------------------------------------------------------------------


def _disk_full_after(nbytes: int):
    """A ``write`` for :func:`storage.write_file` that writes ``nbytes`` bytes
    and then fails as a full disk does."""

    def write(target):
        with open(target, "wb") as f:
            f.write(b"x" * nbytes)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(target))

    return write


@pytest.mark.parametrize("exclusive", [False, True])
def test_write_file_leaves_nothing_when_the_disk_fills(tmp_path, exclusive):
    path = tmp_path / "out.npz"
    with pytest.raises(OSError) as err:
        storage.write_file(path, _disk_full_after(100), exclusive=exclusive)
    assert err.value.errno == errno.ENOSPC
    assert storage.os_error_text(err.value) == "No space left on device"
    assert os.listdir(tmp_path) == []  # neither the file nor its temporary
    storage.write_bytes(path, b"whole", exclusive=exclusive)  # a rerun works
    assert path.read_bytes() == b"whole"
    assert os.listdir(tmp_path) == ["out.npz"]


def test_write_file_leaves_nothing_when_interrupted(tmp_path):
    def interrupted(target):
        target.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        storage.write_file(tmp_path / "a.npz", interrupted, exclusive=True)
    assert os.listdir(tmp_path) == []


def test_exclusive_write_refuses_an_existing_file_and_keeps_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    calls = []
    with pytest.raises(FileExistsError):
        storage.write_file(path, calls.append, exclusive=True)
    assert calls == []  # refused before writing anything
    # A file that appears while the new one is written is not replaced.
    other = tmp_path / "b.txt"

    def racing(target):
        other.write_text("theirs")
        target.write_text("mine")

    with pytest.raises(FileExistsError):
        storage.write_file(other, racing, exclusive=True)
    assert (path.read_text(), other.read_text()) == ("old", "theirs")
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]


def test_exclusive_write_without_hard_links_renames(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(storage.os, "link", no_links)
    storage.write_text(tmp_path / "a.txt", "new", exclusive=True)
    assert (tmp_path / "a.txt").read_text() == "new"
    assert os.listdir(tmp_path) == ["a.txt"]
    with pytest.raises(FileExistsError):
        storage.write_text(tmp_path / "a.txt", "again", exclusive=True)


def test_temporary_names_are_recognised():
    name = storage.temporary_name("val.npz")
    assert name == f".val.npz.{os.getpid()}.tmp"
    assert storage.is_temporary(name)
    assert not storage.is_temporary("val.npz")


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda b: b[:100],
            "is not an .npz archive (np.savez output): it is truncated",
        ),
        (lambda b: b"just text", "is not an .npz archive"),
        (
            lambda b: b.replace(b"\x93NUMPY", b"\x93NUMPZ", 1),
            "is a damaged .npz archive (BadZipFile: Bad CRC-32 for file 'logits.npy').",
        ),
    ],
)
def test_load_npz_names_a_damaged_file_in_one_line(tmp_path, damage, message):
    path = tmp_path / "test.npz"
    storage.save_npz(path, logits=np.ones((40, 3), np.float32))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError) as err:
        storage.load_npz(path)
    text = _one_line(err.value)
    assert text.startswith(f"{path} ")
    assert message in text


def test_check_writable_leaves_nothing(tmp_path):
    storage.check_writable(tmp_path / "a" / "b", what="--out")
    assert os.listdir(tmp_path) == []  # what it created is removed again
    (tmp_path / "c").mkdir()
    storage.check_writable(tmp_path / "c", what="--out")
    assert os.listdir(tmp_path) == ["c"] and os.listdir(tmp_path / "c") == []


def test_check_writable_names_a_path_that_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError) as err:
        storage.check_writable(tmp_path / "file" / "out", what="--out")
    assert _one_line(err.value) == (
        f"--out {tmp_path / 'file' / 'out'} is not writable: Not a directory."
    )

    def read_only(self, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(epath.Path, "write_bytes", read_only)
    with pytest.raises(ValueError, match="out is not writable: Read-only file system"):
        storage.check_writable(tmp_path / "out", what="--out")


def test_check_reachable_deadline_covers_creating_the_client(monkeypatch):
    release = threading.Event()

    def stuck(root):  # a client that looks for credentials forever
        release.wait()
        raise AssertionError("not reached")

    monkeypatch.setattr(storage, "_filesystem", stuck)
    try:
        with pytest.raises(ValueError) as err:
            storage.check_reachable("gs://bkt/run", what="--out", timeout=0.01)
    finally:
        release.set()
    assert _one_line(err.value) == (
        "--out gs://bkt/run: no answer about bucket gs://bkt within 0.01 s (is "
        "the storage endpoint reachable from this host?)."
    )


def test_check_reachable_time_spent_on_the_client_counts(monkeypatch):
    now = [100.0]
    asked = []

    class FS:
        async_impl = False

        def info(self, bucket):
            asked.append(bucket)

    def slow(root):  # creating the client takes 31 s of the 30 s
        now[0] += 31.0
        return FS()

    monkeypatch.setattr(storage, "_clock", lambda: now[0])
    monkeypatch.setattr(storage, "_filesystem", slow)
    with pytest.raises(ValueError, match="no answer about bucket gs://bkt within 30 s"):
        storage.check_reachable("gs://bkt/run", what="--workdir")
    assert asked == []
    now[0] = 0.0

    def quick(root):  # 29 s leaves time to ask
        now[0] += 29.0
        return FS()

    monkeypatch.setattr(storage, "_filesystem", quick)
    storage.check_reachable("gs://bkt/run", what="--workdir")
    assert asked == ["bkt"]


def test_check_reachable_names_a_client_that_fails(monkeypatch):
    def broken(root):
        raise RuntimeError("no credentials\nsecond line")

    monkeypatch.setattr(storage, "_filesystem", broken)
    with pytest.raises(ValueError) as err:
        storage.check_reachable("gs://bkt/run", what="--workdir")
    assert _one_line(err.value) == (
        "--workdir gs://bkt/run: cannot reach bucket gs://bkt (RuntimeError: "
        "no credentials)."
    )
