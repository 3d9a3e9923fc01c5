"""CPC: hand values, the ACLS supplement's gradient and blocked evaluation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import ref_cpc

from calib_jax.losses import _cpc
from calib_jax.losses._cpc import cpc


def _batch(seed, b=16, k=6, scale=8.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    return logits, labels


def _grad(fn, logits, labels, **kw):
    return np.asarray(
        jax.grad(lambda x: jnp.sum(fn(x, labels, **kw)))(jnp.asarray(logits))
    )


@pytest.mark.long
def test_cpc_hand_value():
    logits = np.zeros((1, 4), np.float32)
    # 1v1: 3 pairs of log 2; BE: 6 ordered pairs x 2 log 2 each.
    got = cpc(logits, np.array([1]), lambda_1=1.0, lambda_2=0.5)
    np.testing.assert_allclose(
        got, [3 * math.log(2) + 0.5 * 12 * math.log(2)], rtol=1e-6
    )
    # Two classes: no non-true pair, only the 1v1 term.
    got = cpc(np.array([[2.0, 0.0]], np.float32), np.array([0]), lambda_2=7.0)
    np.testing.assert_allclose(got, [math.log1p(math.exp(-2.0))], rtol=1e-6)


@pytest.mark.long
def test_cpc_gradient_is_acls_supplement_eqs_5_and_6():
    logits, labels = _batch(8, k=6, scale=2.0)
    l1, l2 = 0.7, 0.3
    g = _grad(cpc, logits, labels, lambda_1=l1, lambda_2=l2)
    p = np.exp(logits.astype(np.float64))
    want = np.zeros_like(p)
    for i, y in enumerate(labels):
        for j in range(6):
            if j == y:  # Eq. (5), j = y
                want[i, j] = -l1 * sum(
                    p[i, k] / (p[i, j] + p[i, k]) for k in range(6) if k != y
                )
            else:  # Eq. (5), j != y, plus Eq. (6)
                want[i, j] = l1 * p[i, j] / (p[i, y] + p[i, j]) + l2 * 2 * sum(
                    (p[i, j] - p[i, k]) / (p[i, j] + p[i, k])
                    for k in range(6)
                    if k != y
                )
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


@pytest.mark.long
def test_cpc_blocked_evaluation_matches(monkeypatch):
    # Force several class blocks with padding (7 classes in blocks of 3).
    logits, labels = _batch(9, b=8, k=7, scale=3.0)
    monkeypatch.setattr(_cpc, "_PAIR_BLOCK_ELEMENTS", 8 * 7 * 3)
    blocked = cpc(logits, labels, lambda_2=0.4)
    g_blocked = _grad(cpc, logits, labels, lambda_2=0.4)
    monkeypatch.undo()
    np.testing.assert_allclose(
        blocked, ref_cpc(logits.astype(np.float64), labels, lambda_2=0.4), rtol=1e-5
    )
    np.testing.assert_allclose(blocked, cpc(logits, labels, lambda_2=0.4), rtol=1e-6)
    np.testing.assert_allclose(
        g_blocked, _grad(cpc, logits, labels, lambda_2=0.4), rtol=1e-5, atol=1e-6
    )


def test_cpc_validation():
    x, y = _batch(10)
    with pytest.raises(ValueError, match="lambda_2"):
        cpc(x, y, lambda_2=-1.0)
