"""Random-access sources: ``len(source)`` and ``source[i] -> {'image', 'label'}``.

Every source returns one example as ``{'image': HWC uint8 or float32 ndarray,
'label': int}``; :mod:`calib_jax.data.pipeline` batches them.
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


class TfdsSource:
    """A ``tfds.data_source`` split with only the ``image`` and ``label`` features.

    Reads one record per ``__getitem__``. tfds's batched ``__getitems__`` only
    batches the file reads (decoding stays per record in Python), and it is
    not usable under ``tfds.testing.mock_data`` in tfds 4.9.10, so per-record
    reads are used everywhere.
    """

    def __init__(self, source):
        self.source = source

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

    def __init__(
        self, images_path: epath.PathLike, labels_path: epath.PathLike, severity: int
    ):
        total = storage.read_npy_header(images_path).shape[0]
        n = total // 5
        start, stop = (severity - 1) * n, severity * n
        self.images = storage.load_npy(images_path, start=start, stop=stop)
        labels = storage.load_npy(labels_path)
        self.labels = labels[start:stop] if len(labels) == total else labels
        self.path, self.severity = storage.as_path(images_path), severity

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        return {"image": np.asarray(self.images[i]), "label": int(self.labels[i])}
