"""Paths and whole-file I/O that work alike on local disks and in object stores.

Every path calib_jax reads or writes goes through :func:`as_path`, which turns
a user's string into an ``etils.epath.Path``: a local path, or an object-store
URL (``gs://<bucket>/<path>``; epath also knows ``s3://``, ``az://`` and
``hf://``). A ``pathlib.Path`` would silently turn ``gs://b/run`` into the
local directory ``./gs:/b/run`` on every host; :func:`as_path` refuses such
strings instead, with one line naming the path.

``gs://`` is read and written by ``gcsfs`` (epath's fsspec backend; Orbax
writes array data through tensorstore). Object stores have no directories, no
rename and no append, so the helpers here pick, per path, what keeps a file
whole:

- :func:`write_file`/:func:`write_text`/:func:`write_bytes`: a local file
  is written under a temporary name and renamed into place (also when it
  must not exist yet); an object is uploaded in one request, which the store
  makes visible only once complete.
- :func:`append_text`: local append; an object is rewritten whole.
- :func:`move_tree`: a local rename; objects are copied, then deleted.
- :func:`load_npy`: a local ``.npy`` is memory-mapped; an object is read
  (only the requested rows of a C-ordered array) into memory.

Reachability of a bucket is checked once, before any work
(:func:`check_reachable`): a missing bucket or an unreachable store fails with
one line instead of a traceback after a minute of retries.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import math
import os
import re
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np
from etils import epath

# URL schemes epath maps to object stores (the rest of a URL is bucket/key).
REMOTE_SCHEMES = ("gs", "s3", "az", "hf")
# Schemes that, written without "//", would become a local directory "gs:".
_URL_LIKE = (*REMOTE_SCHEMES, "gcs", "s3a", "abfs", "file", "http", "https")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(/*)(.*)$", re.DOTALL)
# GCS bucket names: 3-63 characters (222 with dots, 63 per dot-separated part)
# of lowercase letters, digits, '-', '_' and '.', starting and ending with a
# letter or digit.
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
# The fsspec package that serves each scheme (named in errors when missing).
_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}
DEFAULT_TIMEOUT = 30.0
# The clock of check_reachable's deadline (a module attribute, so tests can
# replace it).
_clock = time.monotonic
_T = TypeVar("_T")


def _bad(what: str, text: str, why: str) -> ValueError:
    return ValueError(f"{what} {text!r} is not a valid path: {why}.")


def as_path(value: str | os.PathLike, *, what: str = "path") -> epath.Path:
    """Parses a path given by a user into an ``epath.Path``.

    Args:
      value: a local path or an object-store URL (``gs://<bucket>/<path>``),
        as a string, ``pathlib.Path`` or ``epath.Path``.
      what: how errors name the value (e.g. ``"--workdir"``).

    Returns:
      The path; ``gs://`` paths are read and written through gcsfs. An
      ``epath.Path`` is returned as it is: it was parsed where it entered
      (a command-line flag, the argument of a public function), and the
      layers and helpers below pass it on without parsing it again.

    Raises:
      ValueError: one line naming ``value``: an empty path, a URL without a
        bucket, a scheme written with one slash (``gs:/b/x``, which would
        create a local directory ``gs:``), an unsupported scheme, or an
        invalid GCS bucket name.
    """
    if isinstance(value, epath.Path):
        return value
    text = os.fspath(value)
    if not text:
        raise ValueError(f"{what} is empty; give a local path or gs://<bucket>/<path>.")
    match = _SCHEME.match(text)
    if match is None:
        return epath.Path(text)
    scheme, slashes, rest = match.groups()
    scheme = scheme.lower()
    supported = ", ".join(f"{s}://" for s in REMOTE_SCHEMES)
    if slashes.startswith("//"):
        rest = slashes[2:] + rest
        if scheme not in REMOTE_SCHEMES:
            hint = " (write gs:// for Google Cloud Storage)" if scheme == "gcs" else ""
            raise _bad(
                what,
                text,
                f"unsupported scheme {scheme}://{hint}; use a local path or one "
                f"of {supported}",
            )
        bucket = rest.split("/", 1)[0]
        if not bucket:
            raise _bad(
                what, text, f"it names no bucket; write {scheme}://<bucket>/<path>"
            )
        if scheme == "gs" and not (
            _GCS_BUCKET.match(bucket)
            and (len(bucket) <= 63 or "." in bucket)
            and all(0 < len(part) <= 63 for part in bucket.split("."))
        ):
            raise _bad(
                what,
                text,
                f"{bucket!r} is not a GCS bucket name (3-63 lowercase letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit)",
            )
        return epath.Path(f"{scheme}://{rest}")
    if scheme in _URL_LIKE:
        raise _bad(
            what,
            text,
            f"a URL needs two slashes, {scheme}://<bucket>/<path> (as written it "
            f"would be a local directory named '{scheme}:')",
        )
    return epath.Path(text)  # a local name that contains a colon


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object-store URL (``gs://``, ``s3://``, ...)."""
    return os.fspath(path).startswith(tuple(f"{s}://" for s in REMOTE_SCHEMES))


def absolute(path: str | os.PathLike) -> epath.Path:
    """``path`` made absolute when local; object-store URLs are returned as given.

    (``epath.Path.absolute`` would prefix a ``gs://`` URL with the working
    directory.)
    """
    path = as_path(path)
    return path if is_remote(path) else epath.Path(os.path.abspath(path))


def check_reachable(
    path: str | os.PathLike, *, what: str = "path", timeout: float = DEFAULT_TIMEOUT
) -> None:
    """Checks that the bucket of an object-store path exists and answers.

    Local paths are not checked (their errors are specific to what is done
    with them). The check creates the store's client and asks it for the
    bucket once, both within ``timeout`` (the client's search for credentials
    can take seconds, and its own retries of an unreachable endpoint about a
    minute), with the client's logging silenced.

    Args:
      path: a path or URL (parsed by :func:`as_path`).
      what: how errors name the path (e.g. ``"--workdir"``).
      timeout: seconds to wait for the client and the store's answer.

    Raises:
      ValueError: one line naming the path: malformed (see :func:`as_path`),
        the bucket does not exist or is not visible, the store does not
        answer within ``timeout``, or its client package is not installed.
    """
    path = as_path(path, what=what)
    if not is_remote(path):
        return
    scheme, bucket = path.parts[1], path.parts[2]
    root = f"{scheme}://{bucket}"
    # One deadline covers the client's creation (gcsfs looks for credentials
    # first, which takes seconds without a metadata server) and the request.
    deadline = _clock() + timeout

    def silent() -> ValueError:
        return ValueError(
            f"{what} {path}: no answer about bucket {root} within {timeout:g} s "
            "(is the storage endpoint reachable from this host?)."
        )

    try:
        import fsspec.asyn
        from fsspec.exceptions import FSTimeoutError

        fs = _by_deadline(lambda: _filesystem(root), deadline)
    except ImportError as e:
        package = _PACKAGES.get(scheme, "an fsspec implementation")
        raise ValueError(
            f"{what} {path}: {scheme}:// paths need the {package} package "
            f"(pip install {package}); {e}."
        ) from None
    except TimeoutError:
        raise silent() from None
    except Exception as e:  # noqa: BLE001 - any client error means unreachable
        raise _unreachable(what, path, root, e) from None

    left = deadline - _clock()
    if left <= 0:
        raise silent()
    client_log = logging.getLogger(type(fs).__module__.split(".")[0])
    level = client_log.level
    client_log.setLevel(logging.CRITICAL + 1)
    try:
        if getattr(fs, "async_impl", False):
            fsspec.asyn.sync(fs.loop, fs._info, bucket, timeout=left)
        else:
            _by_deadline(lambda: fs.info(bucket), deadline)
    except FileNotFoundError:
        raise ValueError(
            f"{what} {path}: bucket {root} does not exist or is not visible to "
            "these credentials."
        ) from None
    except (FSTimeoutError, TimeoutError):
        raise silent() from None
    except Exception as e:  # noqa: BLE001 - any client error means unreachable
        raise _unreachable(what, path, root, e) from None
    finally:
        client_log.setLevel(level)


def _filesystem(root: str):
    """The fsspec filesystem of ``root`` (``gs://<bucket>``); creating a gcsfs
    client looks for credentials, which can take seconds."""
    import fsspec.core

    return fsspec.core.url_to_fs(root)[0]


def _by_deadline(fn: Callable[[], _T], deadline: float) -> _T:
    """``fn()``, run in a daemon thread, or ``TimeoutError`` once ``deadline``
    (on :data:`_clock`) passes first; the thread is then left to finish on its
    own (a daemon thread does not keep the process alive)."""
    done = threading.Event()
    result: list = []

    def target() -> None:
        try:
            result.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            result.append((False, e))
        finally:
            done.set()

    threading.Thread(target=target, name="storage-deadline", daemon=True).start()
    if not done.wait(max(deadline - _clock(), 0.0)) or not result:
        raise TimeoutError
    ok, value = result[0]
    if not ok:
        raise value
    return value


def _unreachable(what: str, path, root: str, e: BaseException) -> ValueError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return ValueError(
        f"{what} {path}: cannot reach bucket {root} ({type(e).__name__}: {first})."
    )


def make_dirs(path: str | os.PathLike) -> None:
    """Creates a local directory and its parents; nothing for an object store.

    Object stores have no directories: a "directory" exists once an object
    is written under it (and creating one through gcsfs could create a bucket).
    """
    path = as_path(path)
    if not is_remote(path):
        path.mkdir(parents=True, exist_ok=True)


def temporary_name(name: str) -> str:
    """The name a file ``name`` is written under before it is renamed into place
    (hidden, and unique to this process)."""
    return f".{name}.{os.getpid()}.tmp"


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a :func:`temporary_name` (left behind by a killed writer)."""
    return name.startswith(".") and name.endswith(".tmp")


def os_error_text(err: OSError) -> str:
    """An ``OSError`` in a few words (``'No space left on device'``), without
    the errno number and the path, which messages name themselves."""
    if err.strerror:
        return err.strerror
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def write_file(
    path: str | os.PathLike,
    write: Callable[[epath.Path], object],
    *,
    exclusive: bool = False,
) -> None:
    """Has ``write(target)`` write a whole file that readers see whole or not at all.

    Local: ``write`` writes a temporary name beside ``path``
    (:func:`temporary_name`), which is then renamed to ``path``; with
    ``exclusive`` it is linked to ``path`` instead, which fails when ``path``
    exists. An error or interruption (a full disk, Ctrl-C) removes the
    temporary file and leaves ``path`` as it was. Object store: ``write(path)``
    is one upload, which the store publishes only once complete.

    Args:
      path: destination (its directory must exist when local).
      write: writes the whole file to the path it is given.
      exclusive: fail with ``FileExistsError`` when ``path`` exists (checked
        before ``write`` runs too; object store: only then).
    """
    path = as_path(path)
    if exclusive and path.exists():
        raise FileExistsError(os.fspath(path))
    if is_remote(path):
        write(path)
        return
    tmp = path.with_name(temporary_name(path.name))
    try:
        write(tmp)
        if exclusive:
            _publish_new(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# Errors of os.link on file systems without hard links.
_NO_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP}


def _publish_new(tmp: epath.Path, path: epath.Path) -> None:
    """Gives the complete file ``tmp`` the name ``path``, which must not exist."""
    try:
        os.link(tmp, path)  # atomic, and fails when path exists
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        if path.exists():
            raise FileExistsError(os.fspath(path)) from None
        os.replace(tmp, path)


def write_bytes(
    path: str | os.PathLike, data: bytes, *, exclusive: bool = False
) -> None:
    """Writes a whole file so that readers see the old content or the new, never half.

    Local: written under a temporary name beside ``path``, then renamed over
    it. Object store: one upload, which the store publishes only once complete
    (see :func:`write_file`).

    Args:
      path: destination (its directory must exist when local).
      data: the file's content.
      exclusive: fail with ``FileExistsError`` when ``path`` exists.
    """
    write_file(path, lambda target: target.write_bytes(data), exclusive=exclusive)


def check_writable(directory: str | os.PathLike, *, what: str = "path") -> None:
    """Writes and removes a small file in ``directory``, creating it meanwhile.

    Run before long work whose results go there, so that a read-only or
    missing location fails at once. Directories it had to create are removed
    again (the work creates them when it writes).

    Raises:
      ValueError: one line naming ``directory`` and why it cannot be written.
    """
    directory = as_path(directory, what=what)
    probe = directory / temporary_name("write-check")
    created = []  # local directories this check creates, deepest first
    if not is_remote(directory):
        parent = epath.Path(os.path.abspath(directory))
        while not parent.exists() and parent != parent.parent:
            created.append(parent)
            parent = parent.parent
    try:
        make_dirs(directory)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(
            f"{what} {directory} is not writable: {os_error_text(e)}."
        ) from None
    except Exception as e:  # noqa: BLE001 - an object store's client errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(
            f"{what} {directory} is not writable: {type(e).__name__}: {first}."
        ) from None
    finally:
        for path in created:
            try:
                path.rmdir()
            except OSError:
                break  # not created after all, or not empty


def write_text(path: str | os.PathLike, text: str, *, exclusive: bool = False) -> None:
    """:func:`write_bytes` of ``text`` encoded as UTF-8."""
    write_bytes(path, text.encode("utf-8"), exclusive=exclusive)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Appends ``text`` to a file, creating it when missing.

    Objects cannot be appended to (gcsfs turns mode ``'a'`` into an
    overwrite), so an object is read and rewritten whole: fine for logs of a
    few thousand lines, written by one process.
    """
    path = as_path(path)
    if not is_remote(path):
        with path.open("a") as f:
            f.write(text)
        return
    old = path.read_text() if path.exists() else ""
    path.write_text(old + text)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSONL file (local or in an object store), in order.

    Every line is one JSON object; blank lines are skipped. A last line
    without its newline is an append that was cut short (a local append is
    not atomic) and is left out, as the writer of ``metrics.jsonl`` drops it.

    Raises:
      ValueError: another line that is not a JSON object (one line naming
        the file and the line).
    """
    lines = as_path(path).read_text().split("\n")
    rows = []
    for number, line in enumerate(lines[:-1], start=1):  # lines[-1]: cut short
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {number} is not a JSON object record.")
        rows.append(row)
    return rows


def save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """``np.savez`` of ``arrays`` to ``path``, written whole (:func:`write_bytes`)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_bytes(path, buf.getvalue())


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (no pickled objects).

    Raises:
      ValueError: one line naming ``path``: not an ``.npz`` archive (a
        truncated file, another format) or a damaged member.
    """
    path = as_path(path)
    raw = io.BytesIO(path.read_bytes())
    if not zipfile.is_zipfile(raw):
        raise ValueError(
            f"{path} is not an .npz archive (np.savez output): it is truncated "
            "or of another format."
        )
    try:
        with np.load(raw, allow_pickle=False) as f:
            return {key: f[key] for key in f.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(
            f"{path} is a damaged .npz archive ({type(e).__name__}: {first})."
        ) from None


class NpyHeader(NamedTuple):
    """The header of an ``.npy`` file."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int  # bytes before the array data


def read_npy_header_of(f, path) -> NpyHeader:
    """The :class:`NpyHeader` of an open ``.npy`` stream ``f`` at its start
    (a file or an ``.npz`` member); ``path`` names it in the error."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"{path}: .npy format version {version} is not supported.")
    return NpyHeader(tuple(shape), dtype, bool(fortran), f.tell())


def read_npy_header(path: str | os.PathLike) -> NpyHeader:
    """Reads only the header of an ``.npy`` file (shape, dtype, layout)."""
    path = as_path(path)
    with path.open("rb") as f:
        return read_npy_header_of(f, path)


def load_npy(
    path: str | os.PathLike, *, start: int = 0, stop: int | None = None
) -> np.ndarray:
    """Rows ``[start, stop)`` of an ``.npy`` array, read-only.

    A local file is memory-mapped (nothing is read until indexed). An object
    is read into memory; for a C-ordered array only the bytes of the
    requested rows are fetched.

    Args:
      path: the ``.npy`` file.
      start: first row (clipped to the array).
      stop: end row, exclusive (None: to the end; clipped to the array).

    Returns:
      The rows, as a read-only array (a ``np.memmap`` for local files).
    """
    path = as_path(path)
    if not is_remote(path):
        return np.load(os.fspath(path), mmap_mode="r")[start:stop]
    with path.open("rb") as f:
        header = read_npy_header_of(f, path)
        if header.dtype.hasobject:
            raise ValueError(f"{path}: object arrays cannot be loaded.")
        shape, dtype = header.shape, header.dtype
        if not shape or header.fortran_order:
            f.seek(header.offset)
            order = "F" if header.fortran_order else "C"
            data = f.read(math.prod(shape) * dtype.itemsize)
            out = np.frombuffer(data, dtype).reshape(shape, order=order)
            return out[start:stop] if shape else out
        lo, hi, _ = slice(start, stop).indices(shape[0])
        hi = max(hi, lo)
        row = math.prod(shape[1:]) * dtype.itemsize
        f.seek(header.offset + lo * row)
        data = f.read((hi - lo) * row)
    return np.frombuffer(data, dtype).reshape((hi - lo, *shape[1:]))


def move_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Moves the file or directory ``src`` to ``dst`` (which must not exist).

    Local: one rename. Object store (no rename): every object is copied
    under ``dst``, then ``src`` is deleted; an interruption leaves a complete
    ``src``, possibly with a partial copy.
    """
    src, dst = as_path(src), as_path(dst)
    if not (is_remote(src) or is_remote(dst)):
        src.rename(dst)
        return
    if dst.exists():
        raise FileExistsError(f"{dst} exists; cannot move {src} there.")

    def copy(a: epath.Path, b: epath.Path) -> None:
        if a.is_dir():
            for child in a.iterdir():
                copy(child, b / child.name)
        else:
            a.copy(b)

    copy(src, dst)
    if src.is_dir():
        src.rmtree()
    else:
        src.unlink()
