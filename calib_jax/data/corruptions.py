r"""Image corruptions in JAX for benchmarking calibration under dataset shift.

Each corruption maps float images in ``[0, 1]`` of shape ``[N, H, W, C]``
(``C`` = 1 or 3, any ``H x W``) to corrupted images of the same shape and dtype,
clipped to ``[0, 1]``. They are pure, jittable and deterministic given the rng
key (``name`` and ``severity`` are static). Severities 1-5 follow the CIFAR-10-C
/ CIFAR-100-C generation parameters of [1] (32x32 images):

==============  ==============================================  ==================
corruption      severity 1 .. 5 (32x32, as published in [1])    meaning of c
==============  ==============================================  ==================
gaussian_noise  0.04, 0.06, 0.08, 0.09, 0.10                    x + N(0, c^2)
shot_noise      500, 250, 100, 75, 50                           Pois(c x) / c
impulse_noise   0.01, 0.02, 0.03, 0.05, 0.07                    salt-and-pepper
                                                                fraction
gaussian_blur   0.4, 0.6, 0.7, 0.8, 1.0                         sigma (pixels)
defocus_blur    (0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2),   (disk radius,
                (1.5, 0.1)                                      anti-alias sigma)
contrast        0.75, 0.5, 0.4, 0.3, 0.15                       (x - mean) c + mean
brightness      0.05, 0.1, 0.15, 0.2, 0.3                       HSV value + c
saturate        (0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1),         HSV saturation
                (2.5, 0.2)                                      s -> a s + b
pixelate        0.95, 0.9, 0.85, 0.75, 0.65                     side fraction kept
jpeg_like       80, 65, 58, 50, 40                              JPEG quality
==============  ==============================================  ==================

Small images (``max(H, W) <= 16``, e.g. the 8x8 digits) use the same table
except for ``pixelate``: ``int(8 * c)`` gives sizes 7, 7, 6, 6, 5, so
severities would coincide; small images use side fractions
``0.875, 0.75, 0.625, 0.5, 0.375`` instead (one pixel less per severity at 8x8).
The other parameters are kept on purpose: noise, contrast, brightness and
saturation act per pixel and do not depend on the resolution; blur sigmas and
radii are in pixels, and an 8x8 digit stroke is 1-2 pixels wide, comparable to
the fine detail of a 32x32 image (dividing them by 4 would make severities 1-4
of the blurs nearly invisible); JPEG blocks are 8x8 pixels at every resolution.

Departures from [1] (which used PIL, OpenCV, scikit-image and ImageMagick):

* ``jpeg_like`` quantises the 8x8 block DCT of Y, Cb and Cr with the standard
  tables (ITU-T T.81 Annex K) scaled by the IJG quality formula, without the
  4:2:0 chroma subsampling or entropy coding of a real JPEG encoder; images
  whose sides are not multiples of 8 are edge-padded to whole blocks.
* ``pixelate`` reproduces PIL's ``BOX`` resampling (down, then up = nearest).
* ``gaussian_blur`` truncates the kernel at 4 sigma with edge ("nearest")
  padding as scikit-image does; ``defocus_blur`` convolves the disk with a 3x3
  Gaussian and pads by reflection as OpenCV does.
* Grayscale (``C = 1``): ``brightness`` adds to the intensity (the HSV value of
  a gray pixel); ``saturate`` has no chroma to act on, so it falls back to
  scaling each image's deviation from its mean intensity by ``a`` (a contrast
  change with the saturation factor; ``b`` is ignored).
* ``saturate``'s published severities are not ordered by the size of the
  change: 1-2 desaturate (by 70 % and 90 %), 3-5 oversaturate.

``fog``, ``frost``, ``snow``, ``spatter``, ``motion_blur``, ``zoom_blur``,
``glass_blur``, ``elastic`` and ``speckle_noise`` are not implemented; use the
published CIFAR-10-C / CIFAR-100-C files for those.

References:
  [1] D. Hendrycks, T. Dietterich, "Benchmarking Neural Network Robustness to
      Common Corruptions and Perturbations", ICLR 2019, arXiv:1903.12261v1,
      Sec. 3 and Appendix; parameters of its CIFAR-C generation code.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

SEVERITIES = (1, 2, 3, 4, 5)
SMALL_IMAGE_SIZE = 16

PARAMETERS: dict[str, tuple] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500.0, 250.0, 100.0, 75.0, 50.0),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "saturate": ((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    "jpeg_like": (80, 65, 58, 50, 40),
}
# Overrides for images with max(H, W) <= SMALL_IMAGE_SIZE (module docstring).
SMALL_IMAGE_PARAMETERS: dict[str, tuple] = {
    "pixelate": (0.875, 0.75, 0.625, 0.5, 0.375),
}


def parameter(name: str, severity: int, height: int, width: int):
    """The parameter used for ``name`` at ``severity`` on ``height x width`` images."""
    small = max(height, width) <= SMALL_IMAGE_SIZE
    table = SMALL_IMAGE_PARAMETERS.get(name) if small else None
    return (table or PARAMETERS[name])[severity - 1]


# ---- colour helpers -------------------------------------------------------------


def _rgb_to_hsv(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    v = jnp.max(x, axis=-1)
    delta = v - jnp.min(x, axis=-1)
    safe = jnp.where(delta > 0, delta, 1.0)
    s = jnp.where(v > 0, delta / jnp.where(v > 0, v, 1.0), 0.0)
    h = jnp.where(
        b == v,
        4.0 + (r - g) / safe,
        jnp.where(g == v, 2.0 + (b - r) / safe, (g - b) / safe),
    )
    h = jnp.where(delta > 0, jnp.mod(h / 6.0, 1.0), 0.0)
    return h, s, v


# For sector i = floor(6 h), which of (v, t, p, q) goes to R, G and B.
_HSV_SECTORS = np.array(
    [[0, 1, 2], [3, 0, 2], [2, 0, 1], [2, 3, 0], [1, 2, 0], [0, 2, 3]], np.int32
)


def _hsv_to_rgb(h: jax.Array, s: jax.Array, v: jax.Array) -> jax.Array:
    h6 = h * 6.0
    sector = jnp.floor(h6)
    f = h6 - sector
    p = v * (1.0 - s)
    q = v * (1.0 - f * s)
    t = v * (1.0 - (1.0 - f) * s)
    candidates = jnp.stack([v, t, p, q], axis=-1)
    order = jnp.asarray(_HSV_SECTORS)[sector.astype(jnp.int32) % 6]
    return jnp.take_along_axis(candidates, order, axis=-1)


# ---- filtering helpers ----------------------------------------------------------


def _filter2d(x: jax.Array, kernel: np.ndarray, mode: str) -> jax.Array:
    """Correlates each channel of ``x`` ``[N, H, W, C]`` with an odd-sized kernel."""
    kh, kw = kernel.shape
    ph, pw = kh // 2, kw // 2
    height, width = x.shape[1], x.shape[2]
    if mode == "reflect" and (ph >= height or pw >= width):
        mode = "edge"  # reflection needs more pixels than the pad width
    xp = jnp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)), mode=mode)
    out = jnp.zeros_like(x)
    for a in range(kh):
        for b in range(kw):
            if kernel[a, b] != 0.0:
                out = out + float(kernel[a, b]) * xp[:, a : a + height, b : b + width]
    return out


def _gaussian_1d(sigma: float, truncate: float = 4.0) -> np.ndarray:
    radius = int(truncate * sigma + 0.5)
    grid = np.arange(-radius, radius + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (grid / sigma) ** 2)
    return weights / weights.sum()


def _disk_kernel(radius: float, alias_sigma: float) -> np.ndarray:
    """Normalised disk of ``radius`` pixels, smoothed by a 3x3 Gaussian."""
    half = math.ceil(radius)
    grid = np.arange(-half, half + 1, dtype=np.float64)
    disk = (grid[:, None] ** 2 + grid[None, :] ** 2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-((np.arange(3) - 1.0) ** 2) / (2.0 * alias_sigma**2))
    g2 = np.outer(g, g) / np.outer(g, g).sum()
    size = disk.shape[0] + 2
    out = np.zeros((size, size))
    for a in range(3):
        for b in range(3):
            out[a : a + disk.shape[0], b : b + disk.shape[1]] += g2[a, b] * disk
    return out


def _box_down(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]`` weights of PIL ``BOX`` downsampling.

    Every input pixel whose centre lies in an output pixel's footprint gets the
    same weight (PIL's box filter is evaluated at pixel centres).
    """
    if n_out == n_in:
        return np.eye(n_in)
    scale = n_in / n_out
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo = max(int(centre - 0.5 * scale + 0.5), 0)
        hi = min(int(centre + 0.5 * scale + 0.5), n_in)
        for j in range(lo, hi):
            t = (j - centre + 0.5) / scale
            weights[i, j] = 1.0 if -0.5 <= t < 0.5 else 0.0
        weights[i] /= weights[i].sum()
    return weights


def _nearest_up(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]`` weights of PIL ``BOX`` upsampling (nearest pixel)."""
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        weights[i, min(int((i + 0.5) * n_in / n_out), n_in - 1)] = 1.0
    return weights


# Standard JPEG quantisation tables (ITU-T T.81, Annex K, Tables K.1 and K.2).
_JPEG_LUMA = np.array(
    [
        [16, 11, 10, 16, 24, 40, 51, 61],
        [12, 12, 14, 19, 26, 58, 60, 55],
        [14, 13, 16, 24, 40, 57, 69, 56],
        [14, 17, 22, 29, 51, 87, 80, 62],
        [18, 22, 37, 56, 68, 109, 103, 77],
        [24, 35, 55, 64, 81, 104, 113, 92],
        [49, 64, 78, 87, 103, 121, 120, 101],
        [72, 92, 95, 98, 112, 100, 103, 99],
    ],
    np.float64,
)
_JPEG_CHROMA = np.full((8, 8), 99.0)
_JPEG_CHROMA[:4, :4] = [
    [17, 18, 24, 47],
    [18, 21, 26, 66],
    [24, 26, 56, 99],
    [47, 66, 99, 99],
]


def _jpeg_table(base: np.ndarray, quality: int) -> np.ndarray:
    """IJG quality scaling of a base quantisation table."""
    scale = 5000.0 / quality if quality < 50 else 200.0 - 2.0 * quality
    return np.clip(np.floor((base * scale + 50.0) / 100.0), 1.0, 255.0)


def _einsum(spec: str, *operands) -> jax.Array:
    # Full float32 precision: the default on GPU/TPU (TF32/bf16 passes) would
    # move JPEG coefficients across quantisation steps.
    return jnp.einsum(spec, *operands, precision=jax.lax.Precision.HIGHEST)


def _dct_matrix(n: int = 8) -> np.ndarray:
    """Orthonormal DCT-II matrix ``D`` (rows are frequencies): ``X = D x``."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    d = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    d[0] /= np.sqrt(2.0)
    return d


# ---- the corruptions (float32 [N, H, W, C] in, unclipped out) --------------------


def _gaussian_noise(x, rng, c):
    return x + c * jax.random.normal(rng, x.shape, jnp.float32)


def _shot_noise(x, rng, c):
    counts = jax.random.poisson(rng, x * c, x.shape)
    return counts.astype(jnp.float32) / c


def _impulse_noise(x, rng, c):
    k_hit, k_salt = jax.random.split(rng)
    hit = jax.random.uniform(k_hit, x.shape) < c
    salt = jax.random.bernoulli(k_salt, 0.5, x.shape).astype(jnp.float32)
    return jnp.where(hit, salt, x)


def _gaussian_blur(x, rng, sigma):
    del rng
    k = _gaussian_1d(sigma)
    x = _filter2d(x, k[:, None], "edge")
    return _filter2d(x, k[None, :], "edge")


def _defocus_blur(x, rng, c):
    del rng
    radius, alias_sigma = c
    return _filter2d(x, _disk_kernel(radius, alias_sigma), "reflect")


def _channel_mean(x):
    return jnp.mean(x, axis=(1, 2), keepdims=True)


def _contrast(x, rng, c):
    del rng
    mean = _channel_mean(x)
    return (x - mean) * c + mean


def _brightness(x, rng, c):
    del rng
    if x.shape[-1] == 1:
        return x + c
    h, s, v = _rgb_to_hsv(x)
    return _hsv_to_rgb(h, s, jnp.clip(v + c, 0.0, 1.0))


def _saturate(x, rng, c):
    del rng
    a, b = c
    if x.shape[-1] == 1:  # grayscale fallback (module docstring)
        mean = _channel_mean(x)
        return (x - mean) * a + mean
    h, s, v = _rgb_to_hsv(x)
    return _hsv_to_rgb(h, jnp.clip(s * a + b, 0.0, 1.0), v)


def _pixelate(x, rng, c):
    del rng
    height, width = x.shape[1], x.shape[2]
    small_h, small_w = max(int(height * c), 1), max(int(width * c), 1)
    rows = _nearest_up(small_h, height) @ _box_down(height, small_h)
    cols = _nearest_up(small_w, width) @ _box_down(width, small_w)
    rows, cols = jnp.asarray(rows, jnp.float32), jnp.asarray(cols, jnp.float32)
    return _einsum("ih,jw,nhwc->nijc", rows, cols, x)


def _jpeg_like(x, rng, quality):
    del rng
    n, height, width, channels = x.shape
    ph, pw = -height % 8, -width % 8
    y = jnp.pad(x * 255.0, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="edge")
    luma, chroma = _jpeg_table(_JPEG_LUMA, quality), _jpeg_table(_JPEG_CHROMA, quality)
    if channels == 3:
        to_ycc = np.array(
            [
                [0.299, 0.587, 0.114],
                [-0.168736, -0.331264, 0.5],
                [0.5, -0.418688, -0.081312],
            ]
        )
        offset = np.array([0.0, 128.0, 128.0]).reshape(1, 1, 1, 3)
        y = _einsum("nhwc,dc->nhwd", y, to_ycc) + offset
        tables = np.stack([luma, chroma, chroma], axis=-1)  # [8, 8, 3]
    else:
        tables = luma[..., None]
    bh, bw = y.shape[1] // 8, y.shape[2] // 8
    blocks = y.reshape(n, bh, 8, bw, 8, channels) - 128.0
    d = jnp.asarray(_dct_matrix(), jnp.float32)
    coef = _einsum("ui,vj,nbicjk->nbucvk", d, d, blocks)
    q = jnp.asarray(tables[None, None, :, None, :, :], jnp.float32)  # [.., u, ., v, C]
    coef = jnp.round(coef / q) * q
    blocks = _einsum("ui,vj,nbucvk->nbicjk", d, d, coef) + 128.0
    y = blocks.reshape(n, bh * 8, bw * 8, channels)
    if channels == 3:
        y = _einsum("nhwc,dc->nhwd", y - offset, np.linalg.inv(to_ycc))
    return y[:, :height, :width, :] / 255.0


_KERNELS: dict[str, Callable] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur,
    "defocus_blur": _defocus_blur,
    "contrast": _contrast,
    "brightness": _brightness,
    "saturate": _saturate,
    "pixelate": _pixelate,
    "jpeg_like": _jpeg_like,
}


def corrupt(images: ArrayLike, name: str, severity: int, rng: jax.Array) -> jax.Array:
    """Applies corruption ``name`` at ``severity`` to a batch of images.

    Args:
      images: float ``[N, H, W, C]`` in ``[0, 1]``, ``C`` = 1 or 3.
      name: static, a key of :data:`CORRUPTIONS`.
      severity: static int in 1..5 (parameters in the module docstring).
      rng: PRNG key; the output is a deterministic function of ``images`` and
        ``rng``. Ignored by the deterministic corruptions (blurs, contrast,
        brightness, saturate, pixelate, jpeg_like).

    Returns:
      ``[N, H, W, C]`` with the dtype of ``images``, clipped to ``[0, 1]``.

    Raises:
      ValueError: unknown name, severity outside 1..5, or a shape that is not
        ``[N, H, W, 1 | 3]``.
      TypeError: non-floating ``images``.

    References:
      D. Hendrycks, T. Dietterich, ICLR 2019, arXiv:1903.12261v1.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> x = jnp.full((1, 8, 8, 1), 0.5)
      >>> float(corrupt(x, "contrast", 5, jax.random.key(0)).max())
      0.5
    """
    if name not in _KERNELS:
        raise ValueError(
            f"Unknown corruption '{name}'. Valid corruptions: {', '.join(_KERNELS)}."
        )
    if severity not in SEVERITIES:
        raise ValueError(f"Corruption severity must be in 1..5, got {severity}.")
    images = jnp.asarray(images)
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(
            f"Corruptions take images [N, H, W, C] with C = 1 or 3, got {images.shape}."
        )
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise TypeError(f"Corruptions take float images in [0, 1], got {images.dtype}.")
    c = parameter(name, severity, images.shape[1], images.shape[2])
    out = _KERNELS[name](images.astype(jnp.float32), rng, c)
    return jnp.clip(out, 0.0, 1.0).astype(images.dtype)


def _named(name: str) -> Callable[..., jax.Array]:
    def fn(images: ArrayLike, severity: int, rng: jax.Array) -> jax.Array:
        return corrupt(images, name, severity, rng)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"``corrupt(images, '{name}', severity, rng)``; parameters in the module "
        "docstring."
    )
    return fn


# name -> fn(images, severity, rng): the registry of implemented corruptions.
CORRUPTIONS: dict[str, Callable[..., jax.Array]] = {n: _named(n) for n in _KERNELS}
