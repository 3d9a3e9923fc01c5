"""On-device conversion, augmentation and normalisation (jittable, batched)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

# uint8 value v -> float32(v) / float32(255), correctly rounded (computed by NumPy).
_UINT8_TO_FLOAT = np.arange(256, dtype=np.float32) / np.float32(255.0)
_UINT8_TO_FLOAT.flags.writeable = False


def to_float(images: ArrayLike) -> jax.Array:
    """Images as float32 in ``[0, 1]``: uint8 ``v`` becomes ``v / 255``.

    Batches travel to the device as uint8 (a quarter of the float32 bytes) and
    are converted here, inside the jitted step. The result equals the host
    conversion ``images.astype(np.float32) / np.float32(255)`` bit for bit on
    every backend: it is a lookup in the 256 correctly rounded quotients.
    (XLA rewrites ``x / 255`` as ``x * (1 / 255)``, which differs in the last
    bit for 126 of the 256 values.) Float images are returned as float32
    unchanged, so float sources (digits) keep their exact values.

    Args:
      images: uint8 or float array.

    Returns:
      float32 array of the same shape.

    Raises:
      TypeError: any other dtype.
    """
    images = jnp.asarray(images)
    if images.dtype == jnp.uint8:
        return jnp.asarray(_UINT8_TO_FLOAT)[images]
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise TypeError(f"Images must be uint8 or float, got {images.dtype}.")
    return images.astype(jnp.float32)


def random_crop_flip(
    images: ArrayLike, rng: jax.Array, *, padding: int = 4
) -> jax.Array:
    """Standard CIFAR augmentation: zero-pad, random crop, random horizontal flip.

    Each image is zero-padded by ``padding`` pixels on every side (the
    ``RandomCrop(32, padding=4)`` default of the papers' torchvision pipelines;
    padding happens before normalisation, so pads are black), cropped back to
    ``H x W`` at a uniformly random offset, and mirrored left-right with
    probability 0.5. Offsets and flips are drawn independently per image.

    Args:
      images: float ``[B, H, W, C]``.
      rng: PRNG key.
      padding: static int, pixels of zero padding per side.

    Returns:
      ``[B, H, W, C]``, same dtype as ``images``.
    """
    images = jnp.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"Expected images [B, H, W, C], got shape {images.shape}.")
    batch, height, width, channels = images.shape
    k_crop, k_flip = jax.random.split(rng)
    padded = jnp.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    offsets = jax.random.randint(k_crop, (batch, 2), 0, 2 * padding + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(
            image, (offset[0], offset[1], 0), (height, width, channels)
        )

    cropped = jax.vmap(crop)(padded, offsets)
    flip = jax.random.bernoulli(k_flip, 0.5, (batch, 1, 1, 1))
    return jnp.where(flip, cropped[:, :, ::-1, :], cropped)


def normalize(images: ArrayLike, mean: ArrayLike, std: ArrayLike) -> jax.Array:
    """Per-channel standardisation ``(images - mean) / std``.

    Args:
      images: float ``[..., C]`` in ``[0, 1]``.
      mean: ``[C]`` per-channel mean (e.g. ``Dataset.mean``).
      std: ``[C]`` per-channel standard deviation.

    Returns:
      float32 (or wider) ``[..., C]``.
    """
    images = jnp.asarray(images)
    shape = (1,) * (images.ndim - 1) + (-1,)
    mean = jnp.asarray(mean, jnp.float32).reshape(shape)
    std = jnp.asarray(std, jnp.float32).reshape(shape)
    return (images - mean) / std
