"""Logit-margin regularizers: MbLS and ACLS, and the ACLS paper's logit gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _cpu_kernels
from calib_jax.losses._base import (
    first_index,
    first_max,
    take_col,
    zero_excluded_rows,
    zero_masked,
)
from calib_jax.losses._validation_base import (
    check_nonnegative,
    check_variant,
    prepare,
)


def mbls(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    margin: jax.typing.ArrayLike = 10.0,
    alpha: jax.typing.ArrayLike = 0.1,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Margin-based label smoothing (MbLS) penalty, per-example.

    .. math::

        R_{\mathrm{MbLS}}(z) = \alpha \sum_{k=1}^{K}
            \max\bigl(0,\ \max_j z_j - z_k - m\bigr),

    the hinge on every logit distance to the largest logit beyond the margin
    :math:`m` ([1]; ACLS supplement [2], Eq. (14), with :math:`\lambda =
    \alpha`). It is a **sum** over the :math:`K` classes, not a mean (a mean
    has an effective :math:`\alpha/K`). Labels are not used. The primary loss
    (cross-entropy in [1]) is not included.

    Gradient: :math:`\max_j z_j` is differentiated too, so the arg-max logit
    (the first one on a tie) receives :math:`+\alpha` per active hinge; the
    gradient analysis of [2] (Eqs. (15)-(17)) treats it as a constant instead.

    Defaults: those of [1] ([2] uses :math:`m = 6` on CIFAR-10).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)`` (only checked, not used).
      margin: :math:`m \ge 0` (traceable).
      alpha: weight :math:`\alpha \ge 0` (traceable).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] B. Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing for
      Network Calibration", CVPR 2022.
      [2] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      supplementary Sec. S1.4, Eqs. (14)-(17); main paper Sec. 4.1.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[12.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
      >>> print(mbls(logits, jnp.array([0, 0])))  # (2 + 1) * 0.1, then 0
      [0.3 0. ]
    """
    check_nonnegative("margin", margin)
    check_nonnegative("alpha", alpha)
    logits, labels, mask = prepare(logits, labels, where)
    return _mbls(logits, labels, mask, margin, alpha)


@jax.jit
def _mbls(logits, labels, mask, margin, alpha):
    logits, _ = zero_excluded_rows(logits, labels, mask)
    dtype = logits.dtype
    hinge = mbls_hinge(logits, jnp.asarray(margin, dtype))
    return zero_masked(jnp.asarray(alpha, dtype) * hinge, mask)


@kernels.dispatch("loss_mbls", _cpu_kernels.mbls_hinge)
def mbls_hinge(z, margin):
    """``sum_k ReLU(max_j z_j - z_k - margin)`` per row; the maximum moves with
    the first arg-max."""
    top = take_col(z, first_index(z, jnp.max(z, axis=1)))
    gap = top[:, None] - z - margin
    return jnp.sum(jnp.where(gap > 0, gap, 0.0), axis=1)


def acls(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    margin: jax.typing.ArrayLike = 10.0,
    lambda_1: jax.typing.ArrayLike = 0.1,
    lambda_2: jax.typing.ArrayLike = 0.01,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""ACLS regularizer (adaptive and conditional label smoothing), per-example.

    Eq. (13) of [1] summed over the classes, with :math:`\hat y = \arg\max_k
    z_k` the **predicted** class:

    .. math::

        R_{\mathrm{ACLS}}(z) =
            \lambda_1\,\mathrm{ReLU}\bigl(z_{\hat y} - \min_k z_k - M\bigr)^2
            + \lambda_2 \sum_{j \ne \hat y}
              \mathrm{ReLU}\bigl(z_{\hat y} - z_j - M\bigr)^2 .

    Labels are not used. The primary loss of [1], Eq. (14), cross-entropy, is
    not included.

    **Eq. (13) versus Eq. (12).** [1] states Eq. (13) as the integral of its
    logit gradient Eq. (12), but the gradient of Eq. (13), which ``jax.grad``
    of this function gives, differs from Eq. (12) (:func:`acls_logit_grad`):

    * a factor 2 (:math:`\partial_x \mathrm{ReLU}(x)^2 = 2\,\mathrm{ReLU}(x)`);
    * cross terms: :math:`\partial R/\partial z_{\hat y}` gains
      :math:`2\lambda_2\sum_{j \ne \hat y}\mathrm{ReLU}(z_{\hat y} - z_j - M)`
      and the arg-min logit gains
      :math:`-2\lambda_1\mathrm{ReLU}(z_{\hat y} - \min_k z_k - M)`.

    Eq. (12) is :math:`\tfrac12\nabla` of Eq. (13) with ``stop_gradient`` on
    :math:`\min_k z_k` in the first term and on :math:`z_{\hat y}` in the second.
    On ties the first maximal (minimal) class gets the gradient.

    ``variant='released_code'`` computes the authors' ``ACLS.get_reg``
    (cvlab-yonsei/ACLS, ``calibrate/losses/acls.py``) per row:

    .. math::

        \lambda_1\, n_{\max}\,\mathrm{ReLU}(z_{\hat y} - M)^2
        + \frac{\lambda_2}{K - 1}\sum_{j:\, z_j \ne z_{\hat y}}
          \mathrm{ReLU}\bigl(\mathrm{sg}(z_{\hat y}) - z_j - M\bigr)^2 .

    Differences from the paper, one per line:

    * the :math:`\lambda_1` term is :math:`\mathrm{ReLU}(\max_j z_j - M)^2`, not :math:`\mathrm{ReLU}(\max_j z_j - \min_k z_k - M)^2`;
    * the :math:`\lambda_2` term is averaged over the :math:`K - 1` non-maximal classes, not summed ((K-1)x weaker: 9x on CIFAR-10);
    * :math:`z_{\hat y}` is detached in the :math:`\lambda_2` term (the gradient is Eq. (12)'s direction, not that of Eq. (13));
    * the :math:`\lambda_1` term is counted once per class tied at the maximum (the released indicator is ``z == max``);
    * the released ``alpha`` (0.1) that multiplies the whole term is folded into the weights (released ``pos_lambda=1, neg_lambda=0.1, alpha=0.1`` are ``lambda_1=0.1, lambda_2=0.01`` here).

    Defaults: [1], Sec. 4.1 and supplementary S2.2 ([1] uses :math:`M = 6` on CIFAR-10).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)`` (only checked, not used).
      margin: :math:`M \ge 0` (traceable).
      lambda_1: weight of the predicted-class term, :math:`\ge 0`.
      lambda_2: weight of the other-class terms, :math:`\ge 0`.
      variant: static str, ``'paper'`` (Eq. (13) of [1]) or
        ``'released_code'`` (the code of [1], see above).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, Eqs. (10)-(14), Sec. 4.1; supplementary Sec. S2.2. Code:
      github.com/cvlab-yonsei/ACLS, ``calibrate/losses/acls.py``.

    Raises:
      ValueError: a negative ``margin``/``lambda_1``/``lambda_2`` or an
        unknown ``variant``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[13.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
      >>> penalty = acls(logits, jnp.array([0, 0]))  # 0.1*3**2 + 0.01*(9 + 4)
      >>> print(jnp.round(penalty, 5))
      [1.03 0.  ]
    """
    variant = check_variant(variant)
    check_nonnegative("margin", margin)
    check_nonnegative("lambda_1", lambda_1)
    check_nonnegative("lambda_2", lambda_2)
    logits, labels, mask = prepare(logits, labels, where)
    if variant == "released_code":
        logits, _ = zero_excluded_rows(logits, labels, mask)
        return _acls_released(logits, mask, margin, lambda_1, lambda_2)
    return _acls(logits, labels, mask, margin, lambda_1, lambda_2)


@jax.jit
def _acls(logits, labels, mask, margin, lambda_1, lambda_2):
    logits, _ = zero_excluded_rows(logits, labels, mask)
    dtype = logits.dtype
    margin = jnp.asarray(margin, dtype)
    top, low, neg = acls_parts(logits, margin)
    pos = jax.nn.relu(top - low - margin) ** 2
    penalty = jnp.asarray(lambda_1, dtype) * pos + jnp.asarray(lambda_2, dtype) * neg
    return zero_masked(penalty, mask)


@jax.jit
def _acls_released(logits, mask, margin, lambda_1, lambda_2):
    """The released ``get_reg`` per row (its batch mean is the released value)."""
    z = logits
    dtype = z.dtype
    k = z.shape[1]
    margin = jnp.asarray(margin, dtype)
    top = first_max(z)  # torch max(dim=1): the derivative goes to one index
    top_c = lax.stop_gradient(top)
    is_top = lax.stop_gradient(z == top_c[:, None])
    n_top = jnp.sum(is_top.astype(dtype), axis=1)
    pos = n_top * jax.nn.relu(top - margin) ** 2
    gap = jax.nn.relu(top_c[:, None] - z - margin)
    neg = jnp.sum(jnp.where(is_top, 0.0, gap * gap), axis=1) / (k - 1.0)
    penalty = jnp.asarray(lambda_1, dtype) * pos + jnp.asarray(lambda_2, dtype) * neg
    return zero_masked(penalty, mask)


@kernels.dispatch("loss_acls", _cpu_kernels.acls_parts)
def acls_parts(z, margin):
    """``(z_hat, min_k z_k, sum_j ReLU(z_hat - z_j - margin)^2)`` per row (the
    ``j = argmax`` term is 0); ``z_hat`` and the minimum move with the first
    arg-max/arg-min."""
    top = take_col(z, first_index(z, jnp.max(z, axis=1)))
    low = take_col(z, first_index(z, jnp.min(z, axis=1)))
    gap = top[:, None] - z - margin
    relu_gap = jnp.where(gap > 0, gap, 0.0)
    return top, low, jnp.sum(relu_gap * relu_gap, axis=1)


def acls_logit_grad(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    margin: jax.typing.ArrayLike = 10.0,
    lambda_1: jax.typing.ArrayLike = 0.1,
    lambda_2: jax.typing.ArrayLike = 0.01,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""The ACLS paper's closed-form regularizer gradient w.r.t. the logits.

    Eq. (12) of [1], per example and class, with :math:`\hat y = \arg\max_k
    z_k` (the first index on ties):

    .. math::

        g_j = \begin{cases}
            \lambda_1\,\mathrm{ReLU}(z_j - \min_k z_k - M), & j = \hat y \\
            -\lambda_2\,\mathrm{ReLU}(z_{\hat y} - z_j - M), & j \ne \hat y .
        \end{cases}

    This is the smoothing function Eq. (10) times the indicator Eq. (11),
    **not** the gradient of :func:`acls` (see there for the difference); use it
    to train with the paper's stated gradient (e.g. through a custom VJP).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)`` (only checked, not used).
      margin: :math:`M \ge 0`.
      lambda_1: weight of the predicted-class term, :math:`\ge 0`.
      lambda_2: weight of the other-class terms, :math:`\ge 0`.
      where: optional bool ``[B]``; ``False`` rows are all 0.

    Returns:
      float32 ``[B, K]`` (float64 for float64 logits).

    References:
      [1] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, Eqs. (10)-(12).

    Examples:
      >>> import jax.numpy as jnp
      >>> g = acls_logit_grad(jnp.array([[13.0, 0.0, 1.0]]), jnp.array([0]))
      >>> print(g)
      [[ 0.3  -0.03 -0.02]]
    """
    check_nonnegative("margin", margin)
    check_nonnegative("lambda_1", lambda_1)
    check_nonnegative("lambda_2", lambda_2)
    logits, labels, mask = prepare(logits, labels, where)
    return _acls_logit_grad(logits, labels, mask, margin, lambda_1, lambda_2)


@jax.jit
def _acls_logit_grad(logits, labels, mask, margin, lambda_1, lambda_2):
    logits, _ = zero_excluded_rows(logits, labels, mask)
    dtype = logits.dtype
    margin = jnp.asarray(margin, dtype)
    top = jnp.max(logits, axis=1)
    pred = first_index(logits, top)
    low = jnp.min(logits, axis=1, keepdims=True)
    top = top[:, None]
    is_pred = lax.broadcasted_iota(jnp.int32, logits.shape, 1) == pred[:, None]
    pos = jnp.asarray(lambda_1, dtype) * jax.nn.relu(logits - low - margin)
    neg = -jnp.asarray(lambda_2, dtype) * jax.nn.relu(top - logits - margin)
    grad = jnp.where(is_pred, pos, neg)
    return jnp.where(mask[:, None], grad, jnp.zeros_like(grad))
