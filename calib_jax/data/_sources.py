"""Random-access sources: ``len(source)`` and ``source[i] -> {'image', 'label'}``.

Every source returns one example as ``{'image': HWC uint8 or float32 ndarray,
'label': int}``; :mod:`calib_jax.data.pipeline` batches them. Sources that
hold arrays (``images``, ``labels`` attributes: :class:`ArraySource`,
:class:`NpySource`) are batched by one vectorised gather; the others are read
record by record, or decoded once into arrays by :mod:`calib_jax.data.cache`.
A source with a ``cache_key`` (a string naming its content) may be cached on
disk under that key.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

import numpy as np
from etils import epath

from calib_jax import storage


class Source(Protocol):
    """What :mod:`calib_jax.data.pipeline` reads."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


class ArraySource:
    """In-memory arrays ``images [N, H, W, C]`` and ``labels [N]``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        if len(images) != len(labels):
            raise ValueError(
                f"{len(images)} images but {len(labels)} labels; they must match."
            )
        self.images, self.labels = images, np.asarray(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        return {"image": self.images[i], "label": int(self.labels[i])}


class SubsetSource:
    """A random-access view of ``source`` restricted to ``indices``."""

    def __init__(self, source, indices: np.ndarray):
        self.source, self.indices = source, np.asarray(indices, np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.source[int(self.indices[operator.index(index)])]


class TfdsSource:
    """A ``tfds.data_source`` split with only the ``image`` and ``label`` features.

    Reads one record per ``__getitem__`` (a PNG decode for CIFAR). tfds's
    batched ``__getitems__`` only batches the file reads (decoding stays per
    record in Python), and it is not usable under ``tfds.testing.mock_data`` in
    tfds 4.9.10, so per-record reads are used everywhere. Training decodes each
    split once (:mod:`calib_jax.data.cache`) rather than reading it per step.

    Args:
      source: the ``tfds.data_source`` of one split.
      data_dir: the TFDS data dir it was opened from; decoded caches go under
        ``<data_dir>/calib_jax_cache`` unless told otherwise.
    """

    def __init__(self, source, data_dir: str | None = None):
        self.source = source
        self.data_dir = data_dir
        info = getattr(source, "dataset_info", None)
        name = getattr(info, "full_name", None)
        split = getattr(source, "split", None)
        # The dataset's name and version, its split and its files' directory.
        self.cache_key = (
            f"tfds:{name}:{split}:{getattr(info, 'data_dir', '')}"
            if name and split is not None
            else None
        )

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        example = self.source[operator.index(index)]
        return {"image": np.asarray(example["image"]), "label": int(example["label"])}


class NpySource:
    """One severity of a published CIFAR-C ``.npy`` corruption file.

    The file holds the five severities stacked in order, ``[5 n, H, W, C]``; this
    source is rows ``[(severity - 1) n, severity n)``. A local file is
    memory-mapped, so opening a source reads nothing but the header; a file in
    an object store (``gs://``) is read into memory, only this severity's rows
    (:func:`calib_jax.storage.load_npy`).

    Args:
      images_path: ``<corruption>.npy``.
      labels_path: ``labels.npy`` of length ``5 n`` (the published layout) or ``n``.
      severity: 1..5.
    """

    def __init__(self, images_path: epath.Path, labels_path: epath.Path, severity: int):
        total = storage.read_npy_header(images_path).shape[0]
        n = total // 5
        start, stop = (severity - 1) * n, severity * n
        self.images = storage.load_npy(images_path, start=start, stop=stop)
        labels = storage.load_npy(labels_path)
        self.labels = labels[start:stop] if len(labels) == total else labels
        self.path, self.severity = images_path, severity

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        return {"image": np.asarray(self.images[i]), "label": int(self.labels[i])}
