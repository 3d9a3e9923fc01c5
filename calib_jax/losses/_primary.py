"""Primary per-example losses: cross-entropy, label smoothing and the Brier score."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax.losses._base import (
    take_col,
    true_vs_rest,
    zero_excluded_rows,
    zero_masked,
)
from calib_jax.losses._validation_base import check_unit_interval, prepare

_OFF_TARGET = ("uniform", "others")


def cross_entropy(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Softmax cross-entropy (negative log-likelihood), per-example.

    .. math::

        \ell_{\mathrm{CE}}(z, y) = -\log p_y
            = \log\sum_{k=1}^{K} e^{z_k} - z_y,
        \qquad p = \operatorname{softmax}(z).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, Eq. (1) with one-hot :math:`q` and Eq. (2).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
      >>> print(cross_entropy(logits, jnp.array([0, 2])))
      [0.16984606 1.0986123 ]
    """
    logits, labels, mask = prepare(logits, labels, where)
    return _cross_entropy(logits, labels, mask)


@jax.jit
def _cross_entropy(logits, labels, mask):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    loss = jax.nn.logsumexp(logits, axis=1) - take_col(logits, labels)
    return zero_masked(loss, mask)


def label_smoothing(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    epsilon: jax.typing.ArrayLike = 0.1,
    off_target: str = "uniform",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Cross-entropy against label-smoothed targets, per-example.

    With ``off_target='uniform'`` (the default), the label smoothing of [2, 3]
    as restated by [1], Eq. (4): the one-hot target mixed with the uniform
    distribution over **all** :math:`K` classes,

    .. math::

        q_k = (1 - \epsilon)\,[k = y] + \frac{\epsilon}{K},
        \qquad
        \ell_{\mathrm{LS}}(z, y) = -\sum_{k=1}^{K} q_k \log p_k,

    so the true class gets :math:`1 - \epsilon(1 - 1/K)`. ``off_target='others'``
    spreads the mass over the :math:`K - 1` non-target classes only
    (:math:`q_y = 1 - \epsilon`); ``uniform`` with :math:`\epsilon` equals
    ``others`` with :math:`\epsilon (K - 1)/K`. :math:`\epsilon = 0` is
    :func:`cross_entropy`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      epsilon: smoothing mass :math:`\epsilon \in [0, 1]`; default 0.1, the
        value of [2] (Sec. 7) and [3].
      off_target: static str, ``'uniform'`` (all :math:`K` classes, [1]-[3])
        or ``'others'`` (the :math:`K - 1` non-target classes).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, Eqs. (4)-(5).
      [2] C. Szegedy, V. Vanhoucke, S. Ioffe, J. Shlens, Z. Wojna, "Rethinking
      the Inception Architecture for Computer Vision", CVPR 2016, Sec. 7.
      [3] R. Müller et al., "When Does Label Smoothing Help?", NeurIPS 2019.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0]])
      >>> print(label_smoothing(logits, jnp.array([0]), epsilon=0.1))
      [0.33651277]
    """
    if off_target not in _OFF_TARGET:
        raise ValueError(
            f"off_target must be one of {_OFF_TARGET}, got {off_target!r}."
        )
    check_unit_interval("epsilon", epsilon, closed_left=True)
    logits, labels, mask = prepare(logits, labels, where)
    return _label_smoothing(logits, labels, mask, epsilon, off_target=off_target)


@functools.partial(jax.jit, static_argnames="off_target")
def _label_smoothing(logits, labels, mask, epsilon, *, off_target):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    k = logits.shape[1]
    eps = jnp.asarray(epsilon, logits.dtype)
    z_true = take_col(logits, labels)
    total = jnp.sum(logits, axis=1)
    if off_target == "uniform":
        off = total / k
    else:
        off = (total - z_true) / (k - 1)
    # -sum_k q_k log p_k = lse - sum_k q_k z_k, since sum_k q_k = 1.
    loss = jax.nn.logsumexp(logits, axis=1) - (1.0 - eps) * z_true - eps * off
    return zero_masked(loss, mask)


def brier(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Multi-class Brier score of the softmax, per-example.

    .. math::

        \ell_{\mathrm{BS}}(z, y) = \sum_{k=1}^{K} (p_k - [k = y])^2
            = (1 - p_y)^2 + \sum_{k \ne y} p_k^2,

    the squared Euclidean distance between :math:`p` and the one-hot label
    (Brier [2]; [1], Def. A.2, Eq. (19), per sample), in :math:`[0, 2]`: no
    division by :math:`K`, unlike some papers and libraries.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Def. A.2, Eq. (19).
      [2] G. W. Brier, "Verification of Forecasts Expressed in Terms of
      Probability", Monthly Weather Review 78(1), 1950.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[0.0, 0.0], [2.0, 0.0]])
      >>> print(brier(logits, jnp.array([0, 0])))
      [0.5        0.02841867]
    """
    logits, labels, mask = prepare(logits, labels, where)
    return _brier(logits, labels, mask)


@jax.jit
def _brier(logits, labels, mask):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    split = true_vs_rest(logits, labels, squares=True)
    # p_k / (1 - p_y) = e_k / sum_{k' != y} e_k' for every k != y.
    loss = jnp.exp(2.0 * split.log_1m_p_true) * (1.0 + jnp.exp(split.log_sq_ratio))
    return zero_masked(loss, mask)
