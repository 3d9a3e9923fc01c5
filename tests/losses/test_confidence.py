"""Confidence score functions: values, edge cases and derivatives."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _selective_helpers import CSFS
from _selective_helpers import batch as _batch
from _selective_helpers import scores as _scores
from jax.test_util import check_grads

from calib_jax.losses._confidence import msp, neg_entropy, softmax_margin

CSF_FNS = {"msp": msp, "neg_entropy": neg_entropy, "softmax_margin": softmax_margin}


@pytest.mark.parametrize("csf", CSFS)
def test_csf_values_match_reference(csf):
    logits, _ = _batch(10, b=16, k=6)
    got = CSF_FNS[csf](logits.astype(np.float32))
    assert got.dtype == jnp.float32 and got.shape == (16,)
    np.testing.assert_allclose(got, _scores(logits, csf), rtol=1e-5, atol=1e-6)
    low = CSF_FNS[csf](jnp.asarray(logits, jnp.bfloat16))
    assert low.dtype == jnp.float32


def test_csf_edge_cases():
    uniform = np.zeros((1, 4), np.float32)
    np.testing.assert_allclose(msp(uniform), 0.25)
    np.testing.assert_allclose(neg_entropy(uniform), -math.log(4.0), rtol=1e-6)
    np.testing.assert_allclose(softmax_margin(uniform), 0.0)
    one_hot = np.array([[1e4, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(msp(one_hot), 1.0)
    np.testing.assert_allclose(neg_entropy(one_hot), 0.0)
    np.testing.assert_allclose(softmax_margin(one_hot), 1.0)
    np.testing.assert_allclose(softmax_margin(np.zeros((2, 1), np.float32)), 1.0)


@pytest.mark.long
@pytest.mark.parametrize("csf", CSFS)
def test_csf_derivatives_in_forward_and_reverse_mode(csf):
    """The closed-form derivative rule serves jvp and vjp alike."""
    logits, _ = _batch(13, b=8, k=5)
    with jax.enable_x64(True):
        check_grads(
            CSF_FNS[csf],
            (jnp.asarray(logits),),
            order=2,
            modes=("fwd", "rev"),
            eps=1e-5,
            rtol=1e-5,
            atol=1e-8,
        )


def test_msp_gradient_splits_evenly_between_tied_maxima():
    logits = np.array([[1.0, 1.0, 0.0]], np.float32)
    g = np.asarray(jax.grad(lambda x: msp(x)[0])(jnp.asarray(logits)))[0]
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    c = p.max()
    np.testing.assert_allclose(g, c * (np.array([0.5, 0.5, 0.0]) - p), rtol=1e-6)
    # A tie at the top gives a margin of 0 with zero gradient.
    gm = jax.grad(lambda x: softmax_margin(x)[0])(jnp.asarray(logits))
    assert float(softmax_margin(logits)[0]) == 0.0
    np.testing.assert_array_equal(gm, 0.0)
