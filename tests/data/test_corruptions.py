"""JAX corruptions: shapes, range, determinism, severity ordering, reference values."""

import colorsys
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from calib_jax.data import corruptions as C
from calib_jax.data import load_digits

RANDOM = ("gaussian_noise", "shot_noise", "impulse_noise")


def _smooth_rgb(n=4, size=32, seed=0):
    """Natural-ish test images: blurred uniform noise stretched to [0, 1]."""
    x = np.random.default_rng(seed).uniform(size=(n, size, size, 3))
    x = ndimage.gaussian_filter(x, (0, 1.5, 1.5, 0))
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    hi = x.max(axis=(1, 2, 3), keepdims=True)
    return ((x - lo) / (hi - lo)).astype(np.float32)


IMAGES = {
    "digits": load_digits("test")["image"][:16],  # [16, 8, 8, 1]
    "rgb": _smooth_rgb(),  # [4, 32, 32, 3]
}


def test_registry_and_table():
    assert (
        set(C.CORRUPTIONS)
        == set(C.PARAMETERS)
        == {
            "gaussian_noise",
            "shot_noise",
            "impulse_noise",
            "gaussian_blur",
            "defocus_blur",
            "contrast",
            "brightness",
            "saturate",
            "pixelate",
            "jpeg_like",
        }
    )
    assert all(len(v) == 5 for v in C.PARAMETERS.values())
    # Published CIFAR-C values at 32x32 (Hendrycks & Dietterich 2019).
    assert C.parameter("gaussian_noise", 5, 32, 32) == 0.10
    assert C.parameter("pixelate", 1, 32, 32) == 0.95
    assert C.parameter("pixelate", 1, 8, 8) == 0.875  # small-image table


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(C.CORRUPTIONS))
@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_severities_shape_range_determinism_and_order(name, kind):
    x = jnp.asarray(IMAGES[kind])
    sweep = jax.jit(
        lambda x, key: jnp.stack([C.corrupt(x, name, s, key) for s in C.SEVERITIES])
    )
    out = sweep(x, jax.random.key(0))
    assert out.shape == (5, *x.shape) and out.dtype == x.dtype
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    np.testing.assert_array_equal(out, sweep(x, jax.random.key(0)))
    if name in RANDOM:
        assert not np.array_equal(out, sweep(x, jax.random.key(1)))
    change = np.abs(np.asarray(out) - np.asarray(x)[None]).mean(axis=(1, 2, 3, 4))
    assert change[0] > 0
    if name == "saturate":
        # Published order: severities 1-2 desaturate, 3-5 oversaturate.
        assert change[1] > change[0] and change[4] > change[3] > change[2]
    else:
        assert np.all(np.diff(change) >= 0), change


@pytest.mark.long
def test_jit_matches_eager_and_dtype_is_kept():
    x = jnp.asarray(IMAGES["rgb"][:2])
    key = jax.random.key(3)
    for name in ("gaussian_noise", "contrast", "pixelate"):
        eager = C.corrupt(x, name, 3, key)
        jitted = jax.jit(lambda x, k, n=name: C.CORRUPTIONS[n](x, 3, k))(x, key)
        np.testing.assert_allclose(eager, jitted, atol=1e-5)
    low = C.corrupt(x.astype(jnp.bfloat16), "brightness", 2, key)
    assert low.dtype == jnp.bfloat16


def test_validation():
    x = jnp.zeros((1, 8, 8, 3))
    with pytest.raises(ValueError, match="Valid corruptions: gaussian_noise"):
        C.corrupt(x, "fog", 1, None)
    with pytest.raises(ValueError, match="1..5"):
        C.corrupt(x, "contrast", 6, None)
    with pytest.raises(ValueError, match="C = 1 or 3"):
        C.corrupt(jnp.zeros((1, 8, 8, 2)), "contrast", 1, None)
    with pytest.raises(TypeError, match="float"):
        C.corrupt(jnp.zeros((1, 8, 8, 3), jnp.uint8), "contrast", 1, None)


# ---- reference values ---------------------------------------------------------------


def _uint8(x):
    return np.round(np.asarray(x) * 255).astype(np.uint8)


@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_pixelate_matches_pil_box(severity):
    img = _uint8(IMAGES["rgb"][0])
    c = C.parameter("pixelate", severity, 32, 32)
    small = int(32 * c)
    ref = Image.fromarray(img).resize((small, small), Image.BOX)
    ref = np.asarray(ref.resize((32, 32), Image.BOX), np.float64)
    ours = np.asarray(C.corrupt(img[None] / 255.0, "pixelate", severity, None))[0]
    assert np.abs(ours * 255 - ref).max() <= 1.0 + 1e-3  # PIL rounds to uint8


@pytest.mark.parametrize("severity", C.SEVERITIES)
def test_jpeg_like_tracks_pil_on_grayscale(severity):
    # Grayscale JPEG has no chroma subsampling, so PIL's encoder uses the same
    # quantisation; the remaining differences are integer DCT and rounding.
    gray = _uint8(IMAGES["rgb"][1, ..., 0])
    quality = C.parameter("jpeg_like", severity, 32, 32)
    buffer = io.BytesIO()
    Image.fromarray(gray, "L").save(buffer, "JPEG", quality=quality)
    ref = np.asarray(Image.open(buffer), np.float64)
    ours = np.asarray(
        C.corrupt(gray[None, ..., None] / 255.0, "jpeg_like", severity, None)
    )
    diff_to_pil = np.abs(ours[0, ..., 0] * 255 - ref).mean()
    change = np.abs(ref - gray).mean()
    assert diff_to_pil < 0.35 * change


def test_blurs_match_scipy():
    x = IMAGES["rgb"][:1].astype(np.float64)
    for severity in (1, 5):
        sigma = C.parameter("gaussian_blur", severity, 32, 32)
        ref = ndimage.gaussian_filter(
            x, (0, sigma, sigma, 0), mode="nearest", truncate=4.0
        )
        ours = C.corrupt(x.astype(np.float32), "gaussian_blur", severity, None)
        np.testing.assert_allclose(ours, ref, atol=1e-6)
        radius, alias = C.parameter("defocus_blur", severity, 32, 32)
        kernel = C._disk_kernel(radius, alias)
        ref = ndimage.correlate(x, kernel[None, :, :, None], mode="mirror")
        ours = C.corrupt(x.astype(np.float32), "defocus_blur", severity, None)
        np.testing.assert_allclose(ours, np.clip(ref, 0, 1), atol=1e-6)
    # Radius 0.3 keeps only the centre of the disk: the kernel is the 3x3
    # anti-aliasing Gaussian (sigma 0.4) itself.
    g = np.exp(-((np.arange(3) - 1.0) ** 2) / (2 * 0.4**2))
    k = C._disk_kernel(0.3, 0.4)
    np.testing.assert_allclose(k[1:4, 1:4], np.outer(g, g) / np.outer(g, g).sum())
    assert k.sum() == pytest.approx(1.0)


def test_pointwise_formulas():
    x = jnp.asarray(IMAGES["rgb"][:2])
    mean = x.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(
        C.corrupt(x, "contrast", 2, None),
        np.clip((x - mean) * 0.5 + mean, 0, 1),
        atol=1e-6,
    )
    # Brightness adds to the HSV value: gray pixels (any C) move by c, clipped.
    gray = jnp.full((1, 4, 4, 3), 0.5)
    np.testing.assert_allclose(C.corrupt(gray, "brightness", 5, None), 0.8, atol=1e-6)
    np.testing.assert_allclose(
        C.corrupt(gray[..., :1], "brightness", 5, None), 0.8, atol=1e-6
    )
    # Saturate scales HSV saturation: severity 1 multiplies it by 0.3.
    _, s, v = C._rgb_to_hsv(x)
    _, s1, v1 = C._rgb_to_hsv(C.corrupt(x, "saturate", 1, None))
    np.testing.assert_allclose(s1, 0.3 * s, atol=1e-5)
    np.testing.assert_allclose(v1, v, atol=1e-6)
    # Grayscale fallback: the deviation from the image mean is scaled by a.
    g = x[..., :1]
    gm = g.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(
        C.corrupt(g, "saturate", 3, None), np.clip((g - gm) * 1.5 + gm, 0, 1), atol=1e-6
    )


def test_hsv_matches_colorsys_and_round_trips():
    x = jnp.asarray(_smooth_rgb(n=1, size=8, seed=2))
    x = x.at[0, 0, 0].set(jnp.array([0.2, 0.2, 0.2]))  # gray pixel: h = s = 0
    h, s, v = C._rgb_to_hsv(x)
    flat = np.asarray(x).reshape(-1, 3)
    ref = np.array([colorsys.rgb_to_hsv(*p) for p in flat])
    np.testing.assert_allclose(np.stack([h, s, v], -1).reshape(-1, 3), ref, atol=1e-5)
    np.testing.assert_allclose(C._hsv_to_rgb(h, s, v), x, atol=1e-6)


@pytest.mark.long
def test_noise_statistics():
    x = jnp.full((64, 16, 16, 3), 0.5)
    noisy, shot, impulse = jax.jit(
        lambda x, key: [C.corrupt(x, n, 5, key) for n in RANDOM]
    )(x, jax.random.key(0))
    assert float(jnp.std(noisy - x)) == pytest.approx(0.10, rel=0.05)
    # Shot noise at severity 5 is Pois(0.5 * 50) / 50: mean 0.5, std 0.1.
    assert float(jnp.mean(shot)) == pytest.approx(0.5, abs=0.01)
    assert float(jnp.std(shot)) == pytest.approx(0.1, rel=0.05)
    impulse = np.asarray(impulse)
    hit = impulse != 0.5
    assert hit.mean() == pytest.approx(0.07, abs=0.01)
    assert set(np.unique(impulse[hit])) == {0.0, 1.0}
