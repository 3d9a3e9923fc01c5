"""Both formulations of every loss kernel family: values and gradients.

``calib_jax.kernels.use('plain')`` swaps each fused ``custom_jvp`` row kernel
for its plain jnp formulation differentiated by JAX (what runs off the CPU
where ``kernels.FAMILIES`` says so). On every property-suite case that uses a
kernel family, the plain form must match the float64 reference and pass
``check_grads`` in float64, and both forms must agree in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _harness import random_batch
from cases_batch import CASES as BATCH_CASES
from cases_pointwise import CASES as POINTWISE_CASES
from jax.test_util import check_grads

from calib_jax import kernels

# Per-example losses built on a kernel family (the others are plain already).
KERNEL_LOSSES = {"brier", "focal", "focal_adaptive", "dual_focal", "mbls", "acls"}
# The per-example released_code variants are plain JAX (no kernel family).
CASES = [
    c
    for c in POINTWISE_CASES
    if c.fn.__name__ in KERNEL_LOSSES and c.hparams.get("variant") != "released_code"
] + [c for c in BATCH_CASES if c.name != "mdca"]  # the others use loss_rows
ids = [c.name for c in CASES]


def _call(case, logits, labels):
    return case.fn(logits, labels, **case.hparams)


def _value_and_grad(case, logits, labels):
    f = jax.jit(jax.value_and_grad(lambda x, y: jnp.sum(_call(case, x, y))))
    value, grad = f(jnp.asarray(logits), jnp.asarray(labels))
    return np.asarray(value), np.asarray(grad)


@pytest.mark.long  # every loss: about 40 s of make test's budget
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_plain_form_matches_float64_value_and_gradient(case):
    logits, labels = random_batch(case)
    want = np.asarray(case.ref(logits.astype(np.float64), labels, **case.hparams))
    with kernels.use("plain"):
        got = np.asarray(_call(case, logits, labels))
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
        if not case.gradient_is_derivative:
            return
        x, y = random_batch(case, seed=1)
        with jax.enable_x64(True):
            check_grads(
                lambda x: _call(case, x, jnp.asarray(y)),
                (jnp.asarray(x, jnp.float64),),
                order=1,
                modes=("rev",),
                eps=1e-4 if case.smooth else 1e-6,
                atol=case.grad_atol,
                rtol=case.grad_rtol,
            )


@pytest.mark.long  # every loss: about 40 s of make test's budget
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_tuned_and_plain_agree_in_float32(case):
    logits, labels = random_batch(case, seed=2)
    out = {}
    for mode in ("tuned", "plain"):
        with kernels.use(mode):
            out[mode] = _value_and_grad(case, logits, labels)
            jaxpr = jax.make_jaxpr(lambda x: _call(case, x, labels))(logits)
            out[mode] += (str(jaxpr),)
    (v_t, g_t, j_t), (v_p, g_p, j_p) = out["tuned"], out["plain"]
    assert j_t != j_p  # the switch reached this loss's kernel
    np.testing.assert_allclose(v_p, v_t, rtol=1e-5, atol=1e-6)
    scale = max(float(np.max(np.abs(g_t))), 1.0)
    np.testing.assert_allclose(g_p, g_t, rtol=1e-4, atol=1e-5 * scale)
