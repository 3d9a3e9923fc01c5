"""Calibration by pairwise constraints, CPC (Cheng & Vasconcelos 2022)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import take_col, zero_excluded_rows, zero_masked
from calib_jax.losses._validation_base import check_nonnegative, prepare

# Largest [B, block, K] pairwise slab CPC materialises at once (elements).
_PAIR_BLOCK_ELEMENTS = 1 << 22


def cpc(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    lambda_1: jax.typing.ArrayLike = 1.0,
    lambda_2: jax.typing.ArrayLike = 1.0,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Calibration by pairwise constraints (CPC) penalty, per-example.

    The form written out in the ACLS supplement [2], Eqs. (2)-(4), for the
    method of Cheng and Vasconcelos [1]: with :math:`p_a / (p_a + p_b) =
    \sigma(z_a - z_b)`,

    .. math::

        R_{\mathrm{CPC}}(z, y) = \lambda_1 \mathcal{L}_{1v1}
            + \lambda_2 \mathcal{L}_{BE},
        \qquad
        \mathcal{L}_{1v1} = -\sum_{k \ne y} \log\sigma(z_y - z_k),

    .. math::

        \mathcal{L}_{BE} = -\sum_{\substack{k, l \ne y \\ k \ne l}}
            \bigl[\log\sigma(z_k - z_l) + \log\sigma(z_l - z_k)\bigr].

    The double sum runs over **ordered** pairs (each unordered pair counts
    twice), the reading under which the gradient of [2], Eq. (6), holds; the
    :math:`k = l` terms are left out. Both are **sums**, not means, so
    :math:`\mathcal{L}_{BE}` grows like :math:`K^2` (tune :math:`\lambda_2`).
    The form is not checked against the text of [1], and no paper states
    :math:`\lambda_1, \lambda_2`: the defaults 1.0 are **not paper values**.
    The primary cross-entropy of [2], Eq. (2), is not included. Time is
    :math:`O(BK^2)`; memory stays :math:`O(BK)`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      lambda_1: weight of :math:`\mathcal{L}_{1v1}`, :math:`\ge 0`.
      lambda_2: weight of :math:`\mathcal{L}_{BE}`, :math:`\ge 0`.
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] J. Cheng, N. Vasconcelos, "Calibrating Deep Neural Networks by
      Pairwise Constraints", CVPR 2022.
      [2] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, supplementary Sec. S1.2, Eqs. (2)-(8).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
      >>> print(cpc(logits, jnp.array([0, 0])))  # 6 log 2; 2 softplus(-3) + 4 log 2
      [4.158883  2.8697634]
    """
    check_nonnegative("lambda_1", lambda_1)
    check_nonnegative("lambda_2", lambda_2)
    logits, labels, mask = prepare(logits, labels, where)
    b, k = logits.shape
    block = max(1, min(k, _PAIR_BLOCK_ELEMENTS // max(b * k, 1)))
    return _cpc(logits, labels, mask, lambda_1, lambda_2, block=block)


@functools.partial(jax.jit, static_argnames="block")
def _cpc(logits, labels, mask, lambda_1, lambda_2, *, block):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    dtype = logits.dtype
    cols = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    rest = cols != labels[:, None]
    z_true = take_col(logits, labels)
    # -log sigma(z_y - z_k) = softplus(z_k - z_y).
    one_v_one = jnp.sum(
        jnp.where(rest, jax.nn.softplus(logits - z_true[:, None]), 0.0), axis=1
    )
    # Over ordered pairs log s(a) + log s(-a) is summed twice, hence 2x one side.
    exclusion = 2.0 * _pair_softplus_sum(logits, rest, block)
    penalty = (
        jnp.asarray(lambda_1, dtype) * one_v_one
        + jnp.asarray(lambda_2, dtype) * exclusion
    )
    return zero_masked(penalty, mask)


def _pair_softplus_sum(z: jax.Array, rest: jax.Array, block: int) -> jax.Array:
    """``sum_{k != l, rest[k], rest[l]} softplus(z_k - z_l)`` per row, ``[B]``,
    scanned over ``[B, block, K]`` slabs that the backward pass recomputes."""
    b, k = z.shape
    num_blocks = math.ceil(k / block)
    pad = num_blocks * block - k
    z_pad = jnp.pad(z, ((0, 0), (0, pad)))
    rest_pad = jnp.pad(rest, ((0, 0), (0, pad)))
    z_blocks = z_pad.reshape(b, num_blocks, block).transpose(1, 0, 2)
    rest_blocks = rest_pad.reshape(b, num_blocks, block).transpose(1, 0, 2)
    starts = jnp.arange(num_blocks, dtype=jnp.int32) * block
    cols = jnp.arange(k, dtype=jnp.int32)

    @jax.checkpoint
    def step(total, xs):
        z_blk, rest_blk, start = xs
        blk_cols = start + jnp.arange(block, dtype=jnp.int32)
        pair = (
            rest_blk[:, :, None]
            & rest[:, None, :]
            & (blk_cols[:, None] != cols[None, :])[None, :, :]
        )
        terms = jax.nn.softplus(z_blk[:, :, None] - z[:, None, :])
        return total + jnp.sum(jnp.where(pair, terms, 0.0), axis=(1, 2)), None

    total, _ = lax.scan(step, jnp.zeros((b,), z.dtype), (z_blocks, rest_blocks, starts))
    return total
