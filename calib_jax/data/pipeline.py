"""Host-side batching: deterministic training batches and padded eval batches.

Pure numpy on the host; conversion to float, normalisation and augmentation
happen on device (:mod:`calib_jax.data.augment`).

Training batches are a pure function of ``(seed, step)``: example position
``p = step * batch_size + j`` of the endless stream falls in epoch
``p // N`` and reads ``perm_epoch[p % N]``, where ``perm_epoch`` is the
permutation drawn from ``np.random.default_rng([seed, epoch])``. A run resumed
at step ``s`` after preemption therefore sees bit-identical batches, and there
is no iterator state to checkpoint. Under multi-host training each process reads
only its contiguous ``batch_size // process_count`` slice of the global batch,
in process order, which is the layout ``jax.make_array_from_process_local_data``
assembles.

A batch is one vectorised gather ``images[indices]`` when the source holds
arrays (an :class:`~calib_jax.data.ArraySource`, a memory-mapped
:class:`~calib_jax.data.NpySource`, or a split decoded once by
:mod:`calib_jax.data.cache`), and a per-record read otherwise. The trainer
passes ``to_float=False``: uint8 images stay uint8 on the way to the device
(a quarter of the bytes) and :func:`calib_jax.data.augment.to_float` converts
them there to the same floats the host conversion gives.

Plain numpy indexing of the source is used rather than grain's
``MapDataset.shuffle(...).batch(...)``: the order is then defined by the
formula above alone (not by a library's internal permutation, which could
change between versions and break bit-identical resumption), the batch for any
step is computed in O(batch) without replaying an iterator, and every
``__len__``/``__getitem__`` source works (tfds, ``.npy`` memory maps, arrays,
index subsets).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from calib_jax.data._sources import Source, SubsetSource


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    perm.flags.writeable = False
    return perm


def _as_float(images: np.ndarray) -> np.ndarray:
    if images.dtype == np.uint8:
        return images.astype(np.float32) / np.float32(255.0)
    if not np.issubdtype(images.dtype, np.floating):
        raise TypeError(f"Images must be uint8 or float, got {images.dtype}.")
    return images.astype(np.float32, copy=False)


def _arrays(source: Source) -> tuple[np.ndarray, np.ndarray] | None:
    images = getattr(source, "images", None)
    labels = getattr(source, "labels", None)
    if isinstance(images, np.ndarray) and isinstance(labels, np.ndarray):
        return images, labels
    return None


def gather(source: Source, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """Examples ``indices`` of ``source`` stacked, in the source's image dtype.

    One fancy-indexing gather when the source holds arrays (through any
    :class:`~calib_jax.data.SubsetSource` views), else one read per record.

    Args:
      source: random-access source.
      indices: int ``[b]``, each in ``[0, len(source))``.

    Returns:
      ``{'image': [b, H, W, C] (uint8 or float, as stored), 'label': int32 [b]}``.
    """
    indices = np.asarray(indices, np.int64)
    while isinstance(source, SubsetSource):
        indices, source = source.indices[indices], source.source
    arrays = _arrays(source)
    if arrays is not None:
        images, labels = arrays
        return {
            "image": np.asarray(images[indices]),
            "label": np.asarray(labels[indices]).astype(np.int32),
        }
    examples = [source[int(i)] for i in indices]
    return {
        "image": np.stack([np.asarray(e["image"]) for e in examples]),
        "label": np.asarray([e["label"] for e in examples], np.int32),
    }


def _read(
    source: Source, indices: Sequence[int], to_float: bool
) -> dict[str, np.ndarray]:
    batch = gather(source, indices)
    if to_float:
        batch["image"] = _as_float(batch["image"])
    return batch


def _check_processes(batch_size: int, process_index: int, process_count: int) -> int:
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"Need 0 <= process_index < process_count, got {process_index} and "
            f"{process_count}."
        )
    if batch_size % process_count:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by process_count="
            f"{process_count}."
        )
    return batch_size // process_count


def train_indices(
    n: int,
    *,
    step: int,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> np.ndarray:
    """Source indices of this process's slice of the global batch at ``step``.

    Args:
      n: number of examples in the source.
      step: global step (>= 0).
      batch_size: global batch size, divisible by ``process_count``.
      seed: non-negative int; with ``step``, the only input to the order.
      process_index: this process.
      process_count: number of processes.

    Returns:
      int64 ``[batch_size // process_count]``.
    """
    local = _check_processes(batch_size, process_index, process_count)
    if n <= 0:
        raise ValueError("Cannot draw training batches from an empty source.")
    if step < 0 or seed < 0:
        raise ValueError(f"step and seed must be >= 0, got {step} and {seed}.")
    start = step * batch_size + process_index * local
    positions = np.arange(start, start + local, dtype=np.int64)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(local, np.int64)
    for epoch in np.unique(epochs):
        at = epochs == epoch
        out[at] = _permutation(seed, int(epoch), n)[offsets[at]]
    return out


def train_batch(
    source: Source,
    *,
    step: int,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    to_float: bool = True,
) -> dict[str, np.ndarray]:
    """This process's slice of the training batch for global step ``step``.

    Derived only from ``(seed, step)`` (module docstring); the slices of all
    processes, concatenated in process order, form the global batch.

    Args:
      source: random-access source (``len``, ``source[i] -> {'image', 'label'}``).
      step: global step.
      batch_size: global batch size, divisible by ``process_count``.
      seed: non-negative int.
      process_index: this process (``jax.process_index()``).
      process_count: number of processes (``jax.process_count()``).
      to_float: scale uint8 images to float32 in ``[0, 1]`` on the host. False
        keeps the source's dtype, for :func:`calib_jax.data.augment.to_float`
        on device (same floats).

    Returns:
      ``{'image': [b, H, W, C], 'label': int32 [b]}`` with
      ``b = batch_size // process_count``; images float32 in ``[0, 1]``, or as
      stored when ``to_float=False``.
    """
    indices = train_indices(
        len(source),
        step=step,
        batch_size=batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
    )
    return _read(source, indices, to_float)


def eval_batches(
    source: Source,
    *,
    batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
    to_float: bool = True,
) -> Iterator[dict[str, Any]]:
    """Padded, masked batches covering every example of ``source`` exactly once.

    Global batch ``b`` holds examples ``[b * batch_size, (b + 1) * batch_size)``
    in source order; each process yields its contiguous slice. The last batch
    is padded with zero images (label 0, ``mask`` False), never dropped, and every
    process yields the same number of batches, ``ceil(N / batch_size)``.

    Args:
      source: random-access source.
      batch_size: global batch size, divisible by ``process_count``.
      process_index: this process.
      process_count: number of processes.
      to_float: as in :func:`train_batch`.

    Yields:
      ``{'image': [b, H, W, C], 'label': int32 [b], 'mask': bool [b]}`` with
      ``b = batch_size // process_count``; images float32, or as stored when
      ``to_float=False``.
    """
    local = _check_processes(batch_size, process_index, process_count)
    n = len(source)
    if n == 0:
        return
    template = _read(source, [0], to_float)["image"]
    for b in range(math.ceil(n / batch_size)):
        start = b * batch_size + process_index * local
        positions = np.arange(start, start + local)
        mask = positions < n
        if mask.all():
            batch = _read(source, positions, to_float)
            yield {"image": batch["image"], "label": batch["label"], "mask": mask}
            continue
        image = np.zeros((local, *template.shape[1:]), template.dtype)
        label = np.zeros(local, np.int32)
        if mask.any():
            batch = _read(source, positions[mask], to_float)
            image[mask], label[mask] = batch["image"], batch["label"]
        yield {"image": image, "label": label, "mask": mask}
