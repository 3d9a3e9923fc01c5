"""Confidence score functions (CSFs, Zhou et al. 2025, Appendix Table 1) and the
binning of their values."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import Rows, row_stats
from calib_jax.losses._validation_base import check_logits

CSF_NAMES = ("msp", "neg_entropy", "softmax_margin")


def msp(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Maximum softmax probability, a confidence score function (per-example).

    .. math::  g(z) = \max_k \operatorname{softmax}(z)_k

    Args:
      logits: float ``[B, K]``; bf16/fp16 are upcast to float32.

    Returns:
      float32 ``[B]`` in :math:`[1/K, 1]`.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Appendix Table 1 (MSP).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(f"{float(msp(jnp.array([[0.0, 0.0]]))[0]):.2f}")
      0.50
    """
    return _csf(check_logits(logits), csf="msp")


def neg_entropy(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Negative Shannon entropy of the softmax, a confidence score (per-example).

    .. math::  g(z) = \sum_k p_k \log p_k, \qquad p = \operatorname{softmax}(z)

    (Appendix Table 1 of [1] prints :math:`\sum_k z_k\log z_k`; the entropy is
    of the probabilities, which is what is computed here.)

    Args:
      logits: float ``[B, K]``; bf16/fp16 are upcast to float32.

    Returns:
      float32 ``[B]`` in :math:`[-\log K, 0]` (natural logarithm).

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration", 2025,
      Appendix Table 1 (Negative Entropy).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(f"{float(neg_entropy(jnp.array([[0.0, 0.0]]))[0]):.4f}")
      -0.6931
    """
    return _csf(check_logits(logits), csf="neg_entropy")


def softmax_margin(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Gap between the two largest softmax probabilities (per-example score).

    .. math::  g(z) = p_{(1)} - p_{(2)}, \qquad p = \operatorname{softmax}(z)

    with :math:`p_{(1)} \ge p_{(2)}` the two largest entries (0 on a tie; equal
    to :math:`p_{(1)} = 1` when K == 1).

    Args:
      logits: float ``[B, K]``; bf16/fp16 are upcast to float32.

    Returns:
      float32 ``[B]`` in :math:`[0, 1]`.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration", 2025,
      Appendix Table 1 (Softmax Margin).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(f"{float(softmax_margin(jnp.array([[0.0, 0.0]]))[0]):.2f}")
      0.00
    """
    return _csf(check_logits(logits), csf="softmax_margin")


@functools.partial(jax.jit, static_argnames=("csf",))
def _csf(logits, *, csf):
    return csf_score(csf, row_stats(logits, **csf_flags(csf)))


def check_csf(csf) -> str:
    if csf not in CSF_NAMES:
        raise ValueError(
            f"Unknown confidence score function csf={csf!r}; valid: "
            f"{', '.join(CSF_NAMES)}."
        )
    return csf


def csf_flags(csf: str) -> dict:
    """The ``row_stats`` flags a confidence score function needs."""
    return {
        "conf": csf == "msp",
        "entropy": csf == "neg_entropy",
        "margin": csf == "softmax_margin",
    }


def csf_score(csf: str, rows: Rows) -> jax.Array:
    """The CSF ``csf`` from precomputed per-example statistics, ``[B]``."""
    if csf == "msp":
        return rows.conf
    if csf == "neg_entropy":
        return -rows.entropy
    return rows.margin


def score_range(csf: str, num_classes: int) -> tuple[float, float]:
    """The interval ``[lo, hi]`` a CSF takes values in (the bins' support)."""
    if csf == "neg_entropy":
        return -math.log(num_classes), 0.0
    return 0.0, 1.0


def bin_edges(csf: str, num_classes: int, num_bins: int, dtype) -> jax.Array:
    lo, hi = score_range(csf, num_classes)
    return lo + (hi - lo) * jnp.arange(num_bins + 1, dtype=dtype) / num_bins


def histogram(score, mask, edges) -> jax.Array:
    """Eq. (14) counts ``h_k`` of the unmasked scores, ``[M]`` (no gradient):
    bins ``[e_k, e_{k+1})``, the last one closed, scores outside the range in
    the nearest end bin."""
    num_bins = edges.shape[0] - 1
    score = lax.stop_gradient(score)
    # Bin index = number of interior edges at or below the score.
    idx = jnp.sum(score[:, None] >= edges[None, 1:-1], axis=-1)
    onehot = idx[:, None] == jnp.arange(num_bins)[None, :]
    return jnp.sum(jnp.where(mask[:, None] & onehot, 1.0, 0.0), axis=0).astype(
        edges.dtype
    )
