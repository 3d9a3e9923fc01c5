"""On-device augmentation and normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.data import augment


def test_random_crop_flip_takes_shifted_windows_of_the_zero_padded_image():
    images = jax.random.uniform(jax.random.key(0), (32, 8, 8, 3), minval=0.1)
    fn = jax.jit(lambda x, k: augment.random_crop_flip(x, k, padding=2))
    out = fn(images, jax.random.key(1))
    assert out.shape == images.shape and out.dtype == images.dtype
    padded = np.pad(np.asarray(images), ((0, 0), (2, 2), (2, 2), (0, 0)))
    flips, offsets = [], set()
    for i in range(len(images)):
        matches = [
            (dy, dx, flip)
            for dy in range(5)
            for dx in range(5)
            for flip in (False, True)
            if np.array_equal(
                padded[i, dy : dy + 8, dx : dx + 8][:, :: -1 if flip else 1], out[i]
            )
        ]
        assert len(matches) == 1
        flips.append(matches[0][2])
        offsets.add(matches[0][:2])
    assert 0 < sum(flips) < len(flips)  # both outcomes occur
    assert len(offsets) > 5  # offsets vary per image
    np.testing.assert_array_equal(fn(images, jax.random.key(1)), out)  # deterministic


def test_normalize_per_channel():
    images = jnp.broadcast_to(jnp.array([0.5, 0.25, 1.0]), (2, 4, 4, 3))
    out = augment.normalize(images, (0.5, 0.0, 0.5), (1.0, 0.25, 0.5))
    np.testing.assert_allclose(out[0, 0, 0], [0.0, 1.0, 1.0])
    assert out.dtype == jnp.float32
    gray = augment.normalize(jnp.ones((2, 8, 8, 1)), (0.3048,), (0.3758,))
    np.testing.assert_allclose(gray, (1 - 0.3048) / 0.3758, rtol=1e-6)


def test_to_float_equals_the_host_division_bit_for_bit():
    values = np.arange(256, dtype=np.uint8)
    host = values.astype(np.float32) / np.float32(255.0)
    for fn in (augment.to_float, jax.jit(augment.to_float)):
        out = np.asarray(fn(values))
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out.view(np.uint32), host.view(np.uint32))
    images = np.random.default_rng(0).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    np.testing.assert_array_equal(
        jax.jit(augment.to_float)(images), images.astype(np.float32) / np.float32(255)
    )
    floats = np.random.default_rng(1).random((2, 3, 3, 1)).astype(np.float32)
    np.testing.assert_array_equal(augment.to_float(floats), floats)  # unchanged
    with pytest.raises(TypeError, match="uint8 or float"):
        augment.to_float(np.zeros((2, 2), np.int32))
