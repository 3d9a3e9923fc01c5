"""AURC and E-AURC (calib_jax.metrics._aurc) against the float64 references."""

from __future__ import annotations

import _reference_metrics as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from metrics._cases import (
    all_cases,
    close,
    padded_case,
)

from calib_jax import kernels, metrics
from calib_jax.metrics import _aurc

CASES = all_cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_aurc_eaurc(case):
    probs, labels = CASES[case]
    pp, pl, w = padded_case(CASES, case)
    close(metrics.aurc(pp, pl, where=w), ref.aurc(probs, labels), atol=1e-5, rtol=1e-5)
    got = metrics.eaurc(pp, pl, where=w)
    close(got, ref.eaurc(probs, labels), atol=1e-5, rtol=1e-5)
    assert float(got) >= -1e-6


def test_eaurc_geifman_closed_form():
    probs, labels = CASES["softmax_k10"]
    got = metrics.eaurc(probs, labels, optimum="geifman")
    close(got, ref.eaurc(probs, labels, "geifman"), atol=1e-5, rtol=1e-5)


def _aurc_by_groups(conf, err):
    """Float64 AURC, ties by expectation: sum over positions of the mean
    error rate so far (vectorised form of ``ref._aurc_of_errors``)."""

    conf, err = np.asarray(conf, np.float64), np.asarray(err, np.float64)
    n = conf.size
    values, inverse = np.unique(-conf, return_inverse=True)
    size = np.bincount(inverse, minlength=values.size)
    errs = np.bincount(inverse, weights=err, minlength=values.size)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    before = np.concatenate([[0.0], np.cumsum(errs)[:-1]])
    k = np.arange(1, n + 1)
    g = np.repeat(np.arange(values.size), size)
    risk = (before[g] + (k - start[g]) * errs[g] / size[g]) / k
    return risk.sum() / n


@pytest.mark.parametrize("pile", [0.0, 0.3, 0.6])
def test_aurc_tie_groups_deep_in_the_ranking(pile):
    """Groups of ties at every depth (the closed-form group weight's series
    branch from 16 rows above), confidences piled at exactly 1.0 and in
    [0.9999, 1), as a confident classifier's float32 softmax gives."""

    rng = np.random.default_rng(7)
    n = 20_000
    conf = rng.choice(np.float32(1.0) - np.arange(300, dtype=np.float32) * 3e-7, n)
    conf = np.where(rng.random(n) < 0.5, np.round(rng.random(n), 3), conf)
    conf = np.where(rng.random(n) < pile, 1.0, conf).astype(np.float32)
    conf = np.maximum(conf, 0.5)
    err = rng.random(n) < 0.3 * (1.0 - conf) + 0.05
    probs = np.stack([conf, 1.0 - conf], axis=1).astype(np.float32)
    labels = np.where(err, 1, 0)
    labels = np.where(conf == 0.5, 1, labels)  # a tie of both classes: argmax 0
    want = _aurc_by_groups(probs.max(axis=1), labels != 0)
    close(metrics.aurc(jnp.asarray(probs), labels), want, atol=1e-6, rtol=1e-5)


def test_position_and_group_weights_hold_float32_precision_at_the_bottom():
    """The least confident positions weigh about 1/n^2; their weights (and
    the mean weight of a tie group there) keep float32 relative precision at
    n = 10^6 rather than cancelling two digammas near ln n (which lost up to
    1e-2 relative, and 1e-6 of the AURC of a 20k-row split)."""

    n = 1_000_000
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])
    # (a, m): groups of m positions below a others, from the top to the bottom.
    a = np.array([0, 0, 3, 15, 16, 40, 999, 5000, n - 300, n - 2, n - 1, n - 7])
    m = np.array([1, 900, 2, 1, 7, 3, 1, 20_000, 300, 2, 1, 7])
    want = np.array(
        [np.mean(harmonic[n] - harmonic[aa : aa + mm]) / n for aa, mm in zip(a, m)]
    )
    group_weight = jax.jit(_aurc._group_weight, static_argnums=2)
    got = group_weight(jnp.asarray(a, jnp.float32), jnp.asarray(m, jnp.float32), n)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6)
    weights = jax.jit(_aurc._position_weights, static_argnums=(1, 2))
    alpha = np.asarray(weights(jnp.int32(n), n, jnp.float32), np.float64)
    pos = np.array([1, 2, 17, 1000, n // 2, n - 1000, n - 1, n])
    np.testing.assert_allclose(
        alpha[pos - 1], (harmonic[n] - harmonic[pos - 1]) / n, rtol=1e-6
    )


def _tie_heavy(rng, n, pile):
    """Top-label rows of a confident classifier: confidences piled at 1.0 and
    in [0.9999, 1), rounded ones (groups of ties at every depth), errors
    more likely at low confidence."""

    conf = rng.choice(np.float32(1.0) - np.arange(300, dtype=np.float32) * 3e-7, n)
    conf = np.where(rng.random(n) < 0.5, np.round(rng.random(n), 3), conf)
    conf = np.where(rng.random(n) < pile, 1.0, conf).astype(np.float32)
    err = rng.random(n) < 0.3 * (1.0 - conf) + 0.05
    return conf, err


@pytest.mark.parametrize(
    "n",
    [1000] + [pytest.param(k, marks=pytest.mark.long) for k in (1, 127, 128, 20_001)],
)
def test_aurc_tpu_column_form_equals_the_flat_form(n):
    """The tie groups from packed keys in ``[128, N/128]`` columns (what a
    TPU runs) against the float64 group expectation and the CPU's
    flat form: both sort forms, excluded rows, sizes around the lane count."""

    rng = np.random.default_rng(n)
    conf, err = _tie_heavy(rng, n, 0.3)
    valid = rng.random(n) < 0.8
    valid[0] = True
    want = _aurc_by_groups(conf[valid], err[valid])
    args = (jnp.asarray(conf), jnp.asarray(~err), jnp.asarray(valid))
    m = jnp.int32(valid.sum())
    flat, flat_errors = jax.jit(_aurc._aurc_flat)(*args, m)
    close(flat, want, atol=1e-7, rtol=1e-5)
    for mode in ("tuned", "plain"):
        with kernels.use(mode, "sort_keys"):
            got, errors = jax.jit(_aurc._aurc_columns)(*args, m)
        close(got, want, atol=1e-7, rtol=1e-5)
        np.testing.assert_allclose(float(got), float(flat), rtol=2e-6, atol=1e-9)
        assert int(errors) == int(flat_errors) == int(err[valid].sum())
