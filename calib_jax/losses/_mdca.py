r"""Multi-class difference in confidence and accuracy, MDCA (Hebbalaguppe et al.)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses._common import prepare
from calib_jax.losses._margin import _unfused
from calib_jax.losses._rows import _clean


def mdca(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""MDCA regulariser: per-class gap between mean probability and frequency.

    Batch-level; over the :math:`N` unmasked samples,

    .. math::

        \mathrm{MDCA} = \frac{1}{K}\sum_{k=1}^{K}\Big|\frac{1}{N}\sum_{i=1}^{N}
            p_{ik} - \frac{1}{N}\sum_{i=1}^{N} 1[y_i = k]\Big|,

    the difference between the average predicted probability of every class and
    its share of the labels (all classes, not only the top one). It is 0 when
    the batch's mean prediction equals its label distribution. Returns only the
    regularisation term; [1] adds :math:`\beta\cdot\mathrm{MDCA}` to a primary
    loss. The restatement in the ACLS supplement [2], Eq. (9), omits the
    :math:`1/K`, which only rescales :math:`\beta`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch; global-batch semantics under
      data-sharded jit.

    References:
      [1] R. Hebbalaguppe, J. Prakash, N. Madan, C. Arora, "A Stitch in Time
      Saves Nine: A Train-Time Regularizing Loss for Improved Neural Network
      Calibration", CVPR 2022 (the MDCA loss).
      [2] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      supplementary Sec. S1.3, Eq. (9).

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
    logits = _clean(logits, mask)
    dtype = logits.dtype
    mf = mask.astype(dtype)
    mean_prob = kernels.select("loss_mdca", _prob_sums, _prob_sums_plain, logits, mf)
    # Label frequencies by a scatter-add of B ones (no [B, K] one-hot).
    freq = jnp.zeros(logits.shape[-1], dtype).at[labels].add(mf)
    n = jnp.maximum(jnp.sum(mf), 1.0)
    return jnp.mean(jnp.abs((mean_prob - freq) / n))


@jax.custom_jvp
def _prob_sums(x, w):
    r"""``sum_i w_i softmax(x_i)``, ``[K]``, from one exponential pass.

    The row max, the exponentials ``e`` (written once), the row sums ``z`` and
    the weighted column sums of ``e / z`` as a vector-matrix product. The rule
    states the derivative

    .. math::  dP_k = \sum_i w_i p_{ik} (t_{ik} - \textstyle\sum_j p_{ij} t_{ij})
        + \sum_i p_{ik}\, dw_i,

    written with products against ``e``, so that its transpose (the gradient
    ``w_i p_ik (a_k - sum_j p_ij a_j)``) is one matrix-vector product and one
    elementwise pass over ``e``, instead of autodiff's softmax backward through
    the division and the shifted maximum.

    Kernel family ``'loss_mdca'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`_prob_sums_plain`; float64 reference in
    ``tests/_reference_batch.py``.
    """
    return _prob_parts(x, w)[0]


def _prob_sums_plain(x, w):
    """Plain :func:`_prob_sums`: ``jax.nn.softmax`` and autodiff (f32 sums)."""
    return jnp.sum(w[:, None] * jax.nn.softmax(x, axis=-1), axis=0)


def _prob_parts(x, w):
    # The shift is a constant (softmax is shift invariant); _unfused keeps it a
    # reduction of its own, so that XLA:CPU does not write x - max out.
    m = _unfused(jnp.max(x, axis=-1))
    e = jnp.exp(x - m[:, None])
    z = jnp.sum(e, axis=-1)
    return _vecmat(w / z, e), e, z


def _vecmat(v, a):
    """``sum_i v_i a_ik`` at full float precision, ``[K]``."""
    return jnp.dot(v, a, precision=lax.Precision.HIGHEST)


@_prob_sums.defjvp
def _prob_sums_jvp(primals, tangents):
    x, w = primals
    t, dw = tangents
    sums, e, z = _prob_parts(x, w)
    c = w / z  # p_ik w_i = c_i e_ik
    p_t = jnp.sum(e * t, axis=-1) / z  # sum_k p_ik t_ik
    dsums = jnp.sum(c[:, None] * e * t, axis=0) - _vecmat(c * p_t, e)
    dsums = dsums + _vecmat(dw / z, e)
    return sums, dsums
