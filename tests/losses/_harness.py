"""A table-driven property suite shared by every loss in calib_jax.losses.

Each loss contributes a :class:`LossCase` (function, float64 reference,
hyperparameters); ``test_properties.py`` runs every property below on every
case. Loss-specific identities live in the per-module test files.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class LossCase:
    """One loss configuration to test.

    Attributes:
      name: test id.
      fn: ``fn(logits, labels, *, where=None, **hparams)`` from calib_jax.
      ref: float64 numpy reference ``ref(logits, labels, **hparams)`` for an
        unmasked batch; returns ``[B]`` (per-example) or a float (batch-level).
      batch_level: True when ``fn`` returns one scalar over the batch.
      hparams: keyword hyperparameters passed to both.
      rtol, atol: tolerances of the float32 value check.
      grad_rtol, grad_atol: tolerances of the float64 ``check_grads``.
      smooth: False when the loss is only piecewise differentiable in the
        logits in a way a finite difference of the random test batch may
        straddle (then check_grads uses a smaller step).
      num_classes: K of the random test batch.
      batch_size: B of the random test batch (a multiple of 8 for sharding).
      logit_scale: standard deviation of the random logits.
      gradient_is_derivative: False for a loss whose gradient is, by its
        paper's design, not the derivative of its value (AvUC-GS stops
        gradients, App. F); check_grads is not run on it and its own test file
        checks the intended gradient instead.
    """

    name: str
    fn: Callable[..., Any]
    ref: Callable[..., Any]
    batch_level: bool
    hparams: dict = dataclasses.field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-5
    smooth: bool = True
    num_classes: int = 5
    batch_size: int = 32
    logit_scale: float = 2.0
    gradient_is_derivative: bool = True


def random_batch(case: LossCase, seed: int = 0):
    """A float32 logit batch with labels that are right about half the time."""
    rng = np.random.default_rng(seed)
    b, k = case.batch_size, case.num_classes
    logits = rng.normal(scale=case.logit_scale, size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    # Make about half the predictions correct so both branches are exercised.
    correct = rng.random(b) < 0.5
    labels = np.where(correct, logits.argmax(axis=1), labels).astype(np.int32)
    return logits, labels
