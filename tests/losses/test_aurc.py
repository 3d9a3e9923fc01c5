"""AURC as a loss: identities, ties, gradient and validation."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_batch import (
    ref_aurc,
)
from _selective_helpers import CSFS
from _selective_helpers import batch as _batch
from _selective_helpers import ce as _ce
from _selective_helpers import scores as _scores

from calib_jax.losses._aurc import aurc


@pytest.mark.long
@pytest.mark.parametrize("csf", CSFS)
def test_aurc_equals_mean_of_selective_risks_over_all_coverages(csf):
    logits, labels = _batch(0)
    want = ref_aurc(logits, labels, csf=csf)
    with jax.enable_x64(True):
        got = aurc(jnp.asarray(logits), labels, csf=csf)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(
        aurc(logits.astype(np.float32), labels, csf=csf), want, rtol=1e-5
    )


def test_aurc_with_ties_averages_over_tie_breaking():
    logits, labels = _batch(1, b=6)
    # Two exact duplicates of row 0 with other labels: three tied scores.
    logits = np.concatenate([logits, logits[:1], logits[:1]])
    labels = np.concatenate([labels, [(labels[0] + 1) % 5, (labels[0] + 2) % 5]])
    losses = _ce(logits, labels)
    scores = _scores(logits, "msp")
    n = len(scores)
    tied = [0, n - 2, n - 1]
    others = sorted(set(range(n)) - set(tied), key=lambda i: -scores[i])
    above = [i for i in others if scores[i] > scores[0]]
    below = [i for i in others if scores[i] < scores[0]]
    values = []
    for perm in itertools.permutations(tied):
        order = above + list(perm) + below
        risks = [np.mean(losses[order[:m]]) for m in range(1, n + 1)]
        values.append(np.mean(risks))
    with jax.enable_x64(True):
        got = aurc(jnp.asarray(logits), jnp.asarray(labels))
        # Permuting the rows cannot change the value.
        rev = aurc(jnp.asarray(logits[::-1]), jnp.asarray(labels[::-1]))
    np.testing.assert_allclose(got, np.mean(values), rtol=1e-12)
    np.testing.assert_allclose(rev, got, rtol=1e-12)
    assert np.ptp(values) > 1e-3  # the tie really matters for this batch


@pytest.mark.long
def test_aurc_gradient_is_rank_weighted_cross_entropy_gradient():
    """The ranking weights carry no gradient: grad = (1/n) sum alpha_i grad CE_i."""
    logits, labels = _batch(2, b=16)
    scores = _scores(logits, "msp")
    n = len(scores)
    rank = np.empty(n, int)
    rank[np.argsort(-scores)] = np.arange(1, n + 1)
    alpha = np.array([sum(1.0 / m for m in range(r, n + 1)) for r in rank])
    with jax.enable_x64(True):
        x = jnp.asarray(logits)
        got = jax.grad(lambda v: aurc(v, labels))(x)
        p = jax.nn.softmax(x, axis=1)
        want = alpha[:, None] * (p - jax.nn.one_hot(labels, 5)) / n
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


@pytest.mark.long
def test_aurc_is_small_for_a_confident_correct_batch():
    labels = np.arange(16, dtype=np.int32) % 5
    logits = 20.0 * np.eye(5, dtype=np.float32)[labels]
    value = float(aurc(logits, labels))
    # Every CE is log(1 + 4 e^-20) ~ 8e-9 (0 in float32); the weights average 1.
    assert 0.0 <= value < 1e-7
    with jax.enable_x64(True):
        exact = float(aurc(jnp.asarray(logits, jnp.float64), labels))
    np.testing.assert_allclose(exact, math.log1p(4 * math.exp(-20.0)), rtol=1e-6)


def test_aurc_invalid_csf_raises():
    logits, labels = _batch(12, b=8)
    with pytest.raises(ValueError, match="csf"):
        aurc(logits, labels, csf="max")
