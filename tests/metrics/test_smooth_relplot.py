"""smooth_ece(convention='relplot') against the relplot 1.0.3 package itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import metrics

relplot = pytest.importorskip("relplot")

# Bandwidths: 0.003 gives relplot an even smoothing grid (E = 3334, centre a
# half step off), 0.01 its 2000-point floor, 0.2 and 0.5 a kernel cut at
# distance 0.5 that matters.
SIGMAS = (0.003, 0.01, 0.05, 0.2, 0.5)


def confident(scale, seed, n=2000, k=10, temperature=1.5):
    """float32 softmax probabilities of Gaussian logits times ``scale`` and
    labels drawn from the softmax at ``temperature`` (over-confident);
    ``scale`` 40 puts about half of the top-label confidences at exactly 1.0."""
    rng = np.random.default_rng(seed)
    z = (scale * rng.standard_normal((n, k))).astype(np.float32)
    probs = jax.nn.softmax(jnp.asarray(z), axis=-1)
    q = np.asarray(jax.nn.softmax(jnp.asarray(z) / temperature, axis=-1), np.float64)
    cum = np.cumsum(q / q.sum(axis=1, keepdims=True), axis=1)
    labels = np.minimum((rng.random(n)[:, None] > cum).sum(axis=1), k - 1)
    return probs, labels


def _top_label(probs, labels):
    f = np.asarray(jnp.max(probs, axis=-1))  # float32, as relplot is given it
    y = (np.asarray(jnp.argmax(probs, axis=-1)) == labels).astype(np.float64)
    return f, y


def _check(probs, labels, f, y, target="top_label"):
    got = metrics.smooth_ece(probs, labels, target=target, convention="relplot")
    assert abs(float(got) - relplot.smECE(f, y)) < 1e-4
    for sigma in SIGMAS:
        got = metrics.smooth_ece(
            probs, labels, bandwidth=sigma, target=target, convention="relplot"
        )
        want = relplot.smECE_sigma(f, y, sigma)
        assert abs(float(got) - want) < 1e-4, (sigma, float(got), want)


@pytest.mark.long
@pytest.mark.parametrize("scale", [3.0, 40.0])
def test_top_label_equals_relplot(scale):
    probs, labels = confident(scale, seed=0)
    f, y = _top_label(probs, labels)
    if scale == 40.0:
        assert 0.3 < np.mean(f == 1.0) < 0.7  # mass at exactly 1
    _check(probs, labels, f, y)


@pytest.mark.long
def test_binary_with_mass_at_zero_and_one_equals_relplot():
    rng = np.random.default_rng(1)
    p = rng.random(2000)
    p[:400], p[400:800] = 0.0, 1.0
    labels = (rng.random(2000) < np.clip(0.9 * p + 0.05, 0, 1)).astype(np.int32)
    probs = np.stack([1 - p, p], axis=1).astype(np.float32)
    _check(probs, labels, probs[:, 1], labels.astype(np.float64), target="binary")


def test_relplot_reflection_raises_the_value_when_confidences_pile_at_one():
    # Mostly-correct predictions at exactly 1.0 have residual 0; relplot's
    # reflection keeps half of their kernel mass, so the density where the
    # residual is small shrinks and the value rises (docs/metrics.md).
    probs, labels = confident(40.0, seed=0)
    exact = float(metrics.smooth_ece(probs, labels))
    relp = float(metrics.smooth_ece(probs, labels, convention="relplot"))
    assert relp > 1.2 * exact
    default = float(metrics.smooth_ece(probs, labels, convention="exact"))
    assert default == exact  # the default stays the exact value
    # Without mass at the end points the conventions nearly agree.
    probs, labels = confident(3.0, seed=0)
    exact = float(metrics.smooth_ece(probs, labels))
    relp = float(metrics.smooth_ece(probs, labels, convention="relplot"))
    assert abs(relp - exact) < 2e-3


@pytest.mark.long
def test_where_equals_slicing_and_jit_equals_eager():
    probs, labels = confident(40.0, seed=2, n=600)
    where = np.random.default_rng(3).random(600) < 0.7
    masked = metrics.smooth_ece(probs, labels, where=where, convention="relplot")
    sliced = metrics.smooth_ece(probs[where], labels[where], convention="relplot")
    assert abs(float(masked) - float(sliced)) < 1e-6

    def fn(p, y, s):
        return metrics.smooth_ece(p, y, bandwidth=s, convention="relplot")

    eager = fn(probs, labels, 0.05)
    traced = jax.jit(fn)(probs, labels, 0.05)
    assert abs(float(eager) - float(traced)) < 1e-6
