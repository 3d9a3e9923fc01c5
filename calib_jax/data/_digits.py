"""scikit-learn's bundled 8x8 digits: the embedded default dataset (no download)."""

from __future__ import annotations

import functools

import numpy as np

SPLITS = ("train", "val", "test")
NUM_CLASSES = 10
# Fixed split sizes of the 1797 images; the permutation seed never changes, so
# every run and every process sees the same examples in each split.
_SIZES = {"val": 360, "test": 360}
_SPLIT_SEED = 0


@functools.cache
def _all_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as sk_load_digits  # ~1 s import

    bunch = sk_load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., None]  # [N, 8, 8, 1]
    labels = bunch.target.astype(np.int32)
    return images, labels


def load_digits(split: str) -> dict[str, np.ndarray]:
    """Returns one split of the digits data as host arrays.

    The 1797 images are permuted once with a fixed seed and cut into
    ``test`` (360), ``val`` (360) and ``train`` (1077) examples. Pixel values are
    scaled to ``[0, 1]``.

    Args:
      split: one of ``'train'``, ``'val'``, ``'test'``.

    Returns:
      ``{'image': float32 [N, 8, 8, 1], 'label': int32 [N]}``.
    """
    if split not in SPLITS:
        raise ValueError(
            f"Unknown digits split '{split}'. Valid splits: {', '.join(SPLITS)}."
        )
    images, labels = _all_digits()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(labels))
    n_test, n_val = _SIZES["test"], _SIZES["val"]
    index = {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }[split]
    return {"image": images[index], "label": labels[index]}
