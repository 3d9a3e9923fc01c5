"""Out-of-distribution (OOD) image sets, scored against a model's test split.

``OOD_SETS`` holds the sets that exist only to be told apart from the
in-distribution data:

- ``digits_patches``: a far-OOD set for the 8x8 ``digits`` that needs no
  download. scikit-learn's two bundled photographs (``china.jpg`` and
  ``flower.jpg``, 427x640) are turned to gray (ITU-R BT.601 luma), cut into
  the non-overlapping 32x32 tiles of a grid anchored at the top-left corner
  (13 x 20 per photograph: 520 images), each tile is averaged over 4x4
  blocks to 8x8, divided by 255 and rounded to the 17 levels of the digits
  pixels (``round(16 x) / 16``). Deterministic; float32 in ``[0, 1]``, as
  digits' images.
- ``svhn_cropped``: the SVHN cropped-digits test split from a TFDS
  array_record build (the usual OOD set for CIFAR models), 32x32x3 uint8.

:func:`get_ood_source` also accepts any name of ``DATASETS`` (e.g.
``cifar100`` as a near-OOD set for a CIFAR-10 model), read from its
``split``. An OOD set has no labels in the model's classes: its sources say
``-1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from calib_jax.data import _datasets
from calib_jax.data._sources import ArraySource, Source

# Gray levels of the digits images (0..16) and the tile geometry.
_DIGIT_LEVELS = 16
_TILE, _BLOCK = 32, 4


@dataclasses.dataclass(frozen=True)
class OodSet:
    """An OOD image set.

    Attributes:
      name: its name (a key of :data:`OOD_SETS` or of ``DATASETS``).
      image_shape: ``(H, W, C)``; must equal the in-distribution dataset's.
      image_dtype: ``'uint8'`` or ``'float32'`` (in ``[0, 1]``).
      source: the random-access source; every label is ``-1``.
    """

    name: str
    image_shape: tuple[int, int, int]
    image_dtype: str
    source: Source


class _Unlabelled:
    """``source`` with every label replaced by ``-1`` (the set has no class)."""

    def __init__(self, source: Source):
        self.source = source
        key = getattr(source, "cache_key", None)
        # Its own decoded cache: never the labelled split's.
        self.cache_key = f"{key}:unlabelled" if key else None
        self.data_dir = getattr(source, "data_dir", None)
        if hasattr(source, "images"):
            self.images = source.images
            self.labels = np.full(len(source), -1, np.int32)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        return dict(self.source[index], label=-1)


def digits_patches() -> np.ndarray:
    """The ``digits_patches`` images: float32 ``[520, 8, 8, 1]`` in ``[0, 1]``."""
    from sklearn.datasets import load_sample_images  # reads the JPEGs with PIL

    tiles = []
    for photo in load_sample_images().images:
        rgb = np.asarray(photo, np.float64)
        gray = rgb @ np.array([0.299, 0.587, 0.114])
        rows, cols = gray.shape[0] // _TILE, gray.shape[1] // _TILE
        grid = gray[: rows * _TILE, : cols * _TILE]
        grid = grid.reshape(rows, _TILE, cols, _TILE).transpose(0, 2, 1, 3)
        tiles.append(grid.reshape(rows * cols, _TILE, _TILE))
    tiles = np.concatenate(tiles)
    side = _TILE // _BLOCK
    small = tiles.reshape(-1, side, _BLOCK, side, _BLOCK).mean(axis=(2, 4))
    levels = np.round(small / 255.0 * _DIGIT_LEVELS) / _DIGIT_LEVELS
    return levels.astype(np.float32)[..., None]


def _digits_patches(*, data_dir: str | None = None, split: str = "test") -> OodSet:
    del data_dir, split  # built from scikit-learn's bundled photographs
    images = digits_patches()
    labels = np.full(len(images), -1, np.int32)
    return OodSet("digits_patches", (8, 8, 1), "float32", ArraySource(images, labels))


def _svhn_cropped(*, data_dir: str | None = None, split: str = "test") -> OodSet:
    if split not in ("train", "test", "extra"):
        raise ValueError(
            f"Unknown split '{split}' of svhn_cropped. Valid splits: train, test, extra."
        )
    source = _datasets.open_tfds("svhn_cropped", split, data_dir)
    return OodSet("svhn_cropped", (32, 32, 3), "uint8", _Unlabelled(source))


OOD_SETS: dict[str, Callable[..., OodSet]] = {
    "digits_patches": _digits_patches,
    "svhn_cropped": _svhn_cropped,
}


def get_ood_set(name: str, *, data_dir: str | None = None, split: str = "test"):
    """The OOD set ``name``: a key of :data:`OOD_SETS` or of ``DATASETS``.

    Args:
      name: ``'digits_patches'``, ``'svhn_cropped'`` or a registered dataset.
      data_dir: its data dir (TFDS data dir for ``svhn_cropped`` and CIFAR;
        default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
      split: the split read (default ``'test'``; ignored by
        ``digits_patches``).

    Returns:
      An :class:`OodSet`.

    Raises:
      ValueError: an unknown name or split, or missing data (the message says
        how to build it).
    """
    if name in OOD_SETS:
        return OOD_SETS[name](data_dir=data_dir, split=split)
    if name in _datasets.DATASETS:
        ds = _datasets.get_dataset(name, data_dir=data_dir)
        source = _Unlabelled(ds.source(split))
        return OodSet(name, tuple(ds.image_shape), ds.image_dtype, source)
    valid = ", ".join([*OOD_SETS, *_datasets.DATASETS])
    raise ValueError(f"Unknown OOD set '{name}'. Valid: {valid}.")
