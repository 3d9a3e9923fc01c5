"""Decode each split once: into host memory, or into a uint8 ``.npy`` cache.

A TFDS split is a file of encoded records (a PNG per CIFAR image, about
100-200 µs of Python and PIL per record). Reading it record by record at every
step costs more host time than a small network's step on an accelerator, so
:class:`SplitCache` decodes every record of a split once, with a thread pool,
into arrays ``images [N, H, W, C]`` (the stored dtype: uint8 for CIFAR) and
``labels int32 [N]``, and the pipeline gathers batches from those arrays
(:func:`calib_jax.data.pipeline.gather`).

Decoded splits are held in host memory up to ``memory_bytes`` in total (per
process). A split beyond that goes to a cache directory of three files,
``images.npy``, ``labels.npy`` and ``meta.json``, which is memory-mapped when
local (read whole when remote, e.g. ``gs://``) and reused by later runs.
``meta.json`` records what was decoded: the source's ``cache_key`` (dataset,
version, split, files), the number of examples, the image shape and dtype,
and a hash of the first and last records. On open, each of these is checked
against the source (two record reads), and both ``.npy`` headers and file
sizes against ``meta.json``; any difference, a missing or truncated file
rebuilds the cache with a one-line warning, so a cache is never read for a
source it does not match. Every file is written under a temporary name and
renamed into place, ``meta.json`` last.

Sources that already hold arrays (digits' :class:`~calib_jax.data.ArraySource`,
CIFAR-100-C's memory-mapped :class:`~calib_jax.data.NpySource`) are used as
they are.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import logging
import os
import re
import uuid
from typing import Any

import numpy as np
from etils import epath

from calib_jax import storage
from calib_jax.data._sources import ArraySource, Source, SubsetSource

_log = logging.getLogger(__name__)
FORMAT = 1
DEFAULT_DIRNAME = "calib_jax_cache"


def holds_arrays(source: Source) -> bool:
    """Whether ``source`` keeps ``images`` and ``labels`` as numpy arrays."""
    return isinstance(getattr(source, "images", None), np.ndarray) and isinstance(
        getattr(source, "labels", None), np.ndarray
    )


def _workers(workers: int) -> int:
    return workers if workers > 0 else min(8, os.cpu_count() or 1)


def _example(source: Source, index: int) -> tuple[np.ndarray, int]:
    example = source[index]
    return np.asarray(example["image"]), int(example["label"])


def decode(
    source: Source,
    *,
    workers: int = 0,
    images: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Reads every record of ``source`` once into arrays.

    Args:
      source: random-access source.
      workers: reading threads (0: ``min(8, os.cpu_count())``). Decoding PNGs
        releases the GIL for part of each record.
      images: optional preallocated ``[N, H, W, C]`` output (a memory map that
        is being written); allocated when omitted.

    Returns:
      ``(images [N, H, W, C] in the records' dtype, labels int32 [N])``.

    Raises:
      ValueError: an empty source, or records of different shapes or dtypes.
    """
    n = len(source)
    if n == 0:
        raise ValueError("Cannot decode an empty source.")
    first, _ = _example(source, 0)
    if images is None:
        images = np.empty((n, *first.shape), first.dtype)
    labels = np.empty(n, np.int64)

    def fill(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            image, labels[i] = _example(source, i)
            if image.shape != first.shape or image.dtype != first.dtype:
                raise ValueError(
                    f"Record {i} has an image of {image.shape} {image.dtype}; "
                    f"record 0 has {first.shape} {first.dtype}."
                )
            images[i] = image

    count = _workers(workers)
    bounds = np.linspace(0, n, min(n, 16 * count) + 1).astype(int)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        jobs = [pool.submit(fill, lo, hi) for lo, hi in itertools.pairwise(bounds)]
        for job in jobs:
            job.result()  # re-raises a worker's exception
    if n and (labels.min() < np.iinfo(np.int32).min or labels.max() > 2**31 - 1):
        raise ValueError("Labels do not fit in int32.")
    return images, labels.astype(np.int32)


def describe(source: Source) -> dict[str, Any]:
    """What a cache of ``source`` must record: key, size, image shape, dtype, hash.

    Reads two records (the first and the last).
    """
    n = len(source)
    if n == 0:
        raise ValueError("Cannot cache an empty source.")
    digest = hashlib.sha256()
    for i in sorted({0, n - 1}):
        image, label = _example(source, i)
        digest.update(np.ascontiguousarray(image).tobytes())
        digest.update(str(label).encode())
    return {
        "format": FORMAT,
        "cache_key": getattr(source, "cache_key", None),
        "num_examples": n,
        "image_shape": list(image.shape),
        "image_dtype": np.dtype(image.dtype).str,
        "label_dtype": np.dtype(np.int32).str,
        "records_sha256": digest.hexdigest(),
    }


def cache_path(root: str | os.PathLike, cache_key: str) -> epath.Path:
    """The directory under ``root`` that caches the source with ``cache_key``."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", cache_key).strip("_")[:80]
    digest = hashlib.sha256(cache_key.encode()).hexdigest()[:12]
    return epath.Path(root) / f"{readable}-{digest}"


def _is_local(path: epath.Path) -> bool:
    return "://" not in os.fspath(path)


def _read_header(path: epath.Path) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, bytes the file must have) from an ``.npy`` header."""
    header = storage.read_npy_header(path)
    if header.fortran_order:
        raise ValueError("Fortran order")
    size = int(np.prod(header.shape)) * header.dtype.itemsize
    return header.shape, np.dtype(header.dtype), header.offset + size


def _open_array(path: epath.Path, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The array in ``path``, after checking its header and size: else ValueError."""
    got_shape, got_dtype, size = _read_header(path)
    if got_shape != tuple(shape) or got_dtype != dtype:
        raise ValueError(
            f"{path.name} holds {got_shape} {got_dtype}, expected {tuple(shape)} "
            f"{dtype}"
        )
    length = path.stat().length
    if length != size:
        raise ValueError(f"{path.name} has {length} bytes, not {size}")
    if _is_local(path):
        return np.load(os.fspath(path), mmap_mode="r")
    with path.open("rb") as f:
        return np.load(f)


def _try_open(directory: epath.Path, expected: dict) -> tuple[ArraySource | None, str]:
    """(the cached split, '') or (None, why it cannot be used)."""
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        return None, ""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable meta.json ({e})"
    for key, value in expected.items():
        if meta.get(key) != value:
            return None, f"{key} is {meta.get(key)!r}, the source has {value!r}"
    n = expected["num_examples"]
    try:
        images = _open_array(
            directory / "images.npy",
            (n, *expected["image_shape"]),
            np.dtype(expected["image_dtype"]),
        )
        labels = _open_array(directory / "labels.npy", (n,), np.dtype(np.int32))
    except (OSError, ValueError) as e:
        return None, str(e)
    return ArraySource(images, labels), ""


def _save(path: epath.Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    with tmp.open("wb") as f:
        np.save(f, array)
    tmp.replace(path)


def build(
    source: Source,
    directory: str | os.PathLike,
    *,
    workers: int = 0,
    expected: dict[str, Any] | None = None,
) -> ArraySource:
    """Decodes ``source`` into the cache ``directory`` (replacing any old one).

    Args:
      source: a source with a stable ``cache_key``.
      directory: the cache directory of this source (:func:`cache_path`).
      workers: decoding threads.
      expected: ``describe(source)`` when already computed.

    Returns:
      The cached split, opened as :func:`open_or_build` would.
    """
    directory = epath.Path(directory)
    expected = describe(source) if expected is None else expected
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"Cannot create the decoded-split cache {directory} "
            f"({e.strerror or e}); set config.input.cache_dir to a writable "
            "directory, or raise config.input.memory_gb to keep the split in memory."
        ) from None
    meta = directory / "meta.json"
    if meta.exists():
        meta.unlink()  # the cache is invalid from here until it is complete
    n, shape = expected["num_examples"], tuple(expected["image_shape"])
    dtype = np.dtype(expected["image_dtype"])
    target = directory / "images.npy"
    if _is_local(directory):
        # Decoded straight into the memory map: the split never needs to fit
        # in memory.
        tmp = target.with_name(f".images.npy.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        out = np.lib.format.open_memmap(
            os.fspath(tmp), mode="w+", dtype=dtype, shape=(n, *shape)
        )
        _, labels = decode(source, workers=workers, images=out)
        out.flush()
        del out
        tmp.replace(target)
    else:
        images, labels = decode(source, workers=workers)
        _save(target, images)
    _save(directory / "labels.npy", labels)
    tmp = meta.with_name(f".meta.json.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(expected, indent=1) + "\n")
    tmp.replace(meta)
    opened, problem = _try_open(directory, expected)
    if opened is None:
        raise OSError(
            f"The cache just written to {directory} cannot be read: {problem}."
        )
    return opened


def open_or_build(
    source: Source, directory: str | os.PathLike, *, workers: int = 0
) -> ArraySource:
    """The decoded split of ``source`` from the cache ``directory``, built if needed.

    A cache that does not match ``source`` (module docstring) is rebuilt with a
    one-line warning; it is never read.

    Args:
      source: a source with a stable ``cache_key``.
      directory: the cache directory of this source (:func:`cache_path`).
      workers: decoding threads.

    Returns:
      An :class:`~calib_jax.data.ArraySource` over the cached arrays
      (memory-mapped when local).
    """
    directory = epath.Path(directory)
    expected = describe(source)
    opened, problem = _try_open(directory, expected)
    if opened is not None:
        return opened
    if problem:
        _log.warning(
            "Decoded cache %s does not match its source (%s); rebuilding it.",
            directory,
            problem,
        )
    return build(source, directory, workers=workers, expected=expected)


class SplitCache:
    """Decodes each split once per run and serves it as arrays.

    Args:
      memory_bytes: decoded splits are held in host memory up to this total;
        a split that would exceed it goes to the on-disk cache instead (0: every
        split goes there).
      cache_dir: root of the on-disk caches; None puts them beside the dataset,
        under ``<TFDS data dir>/calib_jax_cache``.
      workers: decoding threads (0: ``min(8, os.cpu_count())``).
    """

    def __init__(
        self,
        *,
        memory_bytes: float = 4 * 2**30,
        cache_dir: str | os.PathLike | None = None,
        workers: int = 0,
    ):
        self.memory_bytes = memory_bytes
        self.cache_dir = cache_dir
        self.workers = workers
        self.held_bytes = 0
        self._decoded: dict[str, Source] = {}

    def _root(self, source: Source) -> epath.Path:
        if self.cache_dir:
            return epath.Path(self.cache_dir)
        data_dir = getattr(source, "data_dir", None)
        if not data_dir:
            raise ValueError(
                "A decoded split exceeds config.input.memory_gb and its source has "
                "no data dir to cache it beside; set config.input.cache_dir."
            )
        return epath.Path(data_dir) / DEFAULT_DIRNAME

    def get(self, source: Source) -> Source:
        """``source`` as arrays: itself if it holds them, else decoded once.

        The same split (same ``cache_key``) is decoded only on its first
        ``get``; later calls return the same arrays.
        """
        if holds_arrays(source) or len(source) == 0:
            return source
        if isinstance(source, SubsetSource):
            return SubsetSource(self.get(source.source), source.indices)
        key = getattr(source, "cache_key", None)
        if key is not None and key in self._decoded:
            return self._decoded[key]
        nbytes = len(source) * _example(source, 0)[0].nbytes
        if key is None and self.held_bytes + nbytes > self.memory_bytes:
            _log.warning(
                "A split of %d bytes exceeds the memory budget but its source has "
                "no cache_key to cache it on disk; holding it in memory.",
                nbytes,
            )
        if key is None or self.held_bytes + nbytes <= self.memory_bytes:
            images, labels = decode(source, workers=self.workers)
            decoded: Source = ArraySource(images, labels)
            self.held_bytes += nbytes
        else:
            decoded = open_or_build(
                source, cache_path(self._root(source), key), workers=self.workers
            )
        if key is not None:
            self._decoded[key] = decoded
        return decoded
