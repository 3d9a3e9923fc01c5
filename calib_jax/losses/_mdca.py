r"""Multi-class difference in confidence and accuracy, MDCA (Hebbalaguppe et al.)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import zero_excluded_logits
from calib_jax.losses._validation_base import prepare


def mdca(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""MDCA regulariser: per-class gap between mean probability and frequency.

    Over the :math:`N` unmasked samples (batch-level),

    .. math::

        \mathrm{MDCA} = \frac{1}{K}\sum_{k=1}^{K}\Big|\frac{1}{N}\sum_{i=1}^{N}
            p_{ik} - \frac{1}{N}\sum_{i=1}^{N} 1[y_i = k]\Big|,

    only the regulariser; [1] adds :math:`\beta\cdot\mathrm{MDCA}` to a
    primary loss. [2], Eq. (9), omits the :math:`1/K` (it rescales :math:`\beta`).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    References:
      [1] R. Hebbalaguppe, J. Prakash, N. Madan, C. Arora, "A Stitch in Time
      Saves Nine: A Train-Time Regularizing Loss for Improved Neural Network
      Calibration", CVPR 2022 (the MDCA loss).
      [2] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, supplementary Sec. S1.3, Eq. (9).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(mdca(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.0688
    """
    logits, labels, mask = prepare(logits, labels, where)
    return _mdca(logits, labels, mask)


@jax.jit
def _mdca(logits, labels, mask):
    logits = zero_excluded_logits(logits, mask)
    dtype = logits.dtype
    mf = mask.astype(dtype)
    # sum_i w_i p_ik: the softmax written out, its shift a constant.
    e = jnp.exp(logits - lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))
    mean_prob = jnp.sum((mf / jnp.sum(e, axis=-1))[:, None] * e, axis=0)
    # Label frequencies by a scatter-add of B ones (no [B, K] one-hot).
    freq = jnp.zeros(logits.shape[-1], dtype).at[labels].add(mf)
    n = jnp.maximum(jnp.sum(mf), 1.0)
    return jnp.mean(jnp.abs((mean_prob - freq) / n))
