"""The focal family: focal, sample-dependent focal (FLSD-53), inverse and dual focal.

Weights are evaluated in log space from the true-class-versus-rest log-odds
(``_base.true_vs_rest``): ``(1 - p_y)^gamma = exp(gamma log(1 - p_y))`` has no
0-to-a-power gradient trap, for any ``gamma >= 0``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _cpu_kernels
from calib_jax.losses._base import (
    first_index,
    take_col,
    true_vs_rest,
    zero_excluded_rows,
    zero_masked,
)
from calib_jax.losses._validation_base import (
    check_nonnegative,
    check_unit_interval,
    check_variant,
    prepare,
)

_DUAL_VARIANTS = ("paper", "reweighted_risk_description", "released_code")


def focal(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    gamma: jax.typing.ArrayLike = 3.0,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Focal loss, per-example.

    .. math::

        \ell_{\mathrm{FL}}(z, y) = -(1 - p_y)^{\gamma} \log p_y,
        \qquad p = \operatorname{softmax}(z),

    the multi-class focal loss of Lin et al. [2] without the class weight
    :math:`\alpha`, as used for calibration by Mukhoti et al. [3] ([1],
    Def. 3.1, Eq. (2)). :math:`\gamma = 0` is :func:`cross_entropy`.

    The default :math:`\gamma = 3` is "FL-3" of [3], the focal baseline of
    [4] (Sec. 5.3); the sample-dependent rule of [3] (:func:`focal_adaptive`)
    picks :math:`\gamma = 3` for 95% of the samples ([5], Sec. S1.1).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      gamma: focusing parameter :math:`\gamma \ge 0` (traceable).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Def. 3.1, Eq. (2).
      [2] T.-Y. Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017.
      [3] J. Mukhoti et al., "Calibrating Deep Neural Networks using Focal Loss",
      NeurIPS 2020, arXiv:2002.09437.
      [4] S. Jung, S. Seo, Y. Jeong, J. Choi, "Scaling of Class-wise Training
      Losses for Post-hoc Calibration", ICML 2023, Sec. 5.3.
      [5] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, supplementary Sec. S1.1.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
      >>> print(focal(logits, jnp.array([0, 2]), gamma=3.0))
      [0.00064735 0.3255148 ]
    """
    check_nonnegative("gamma", gamma)
    logits, labels, mask = prepare(logits, labels, where)
    return _focal(logits, labels, mask, gamma)


@jax.jit
def _focal(logits, labels, mask, gamma):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    split = true_vs_rest(logits, labels)
    gamma = jnp.asarray(gamma, logits.dtype)
    loss = -jnp.exp(gamma * split.log_1m_p_true) * split.log_p_true
    return zero_masked(loss, mask)


def focal_adaptive(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    threshold: jax.typing.ArrayLike = 0.2,
    gamma_below: jax.typing.ArrayLike = 5.0,
    gamma_above: jax.typing.ArrayLike = 3.0,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Focal loss with the sample-dependent :math:`\gamma` "FLSD-53", per-example.

    .. math::

        \ell(z, y) = -(1 - p_y)^{\gamma(p_y)} \log p_y, \qquad
        \gamma(p_y) = \begin{cases} 5, & p_y \in [0, 0.2) \\
                                    3, & p_y \in [0.2, 1] \end{cases}

    with :math:`p_y` the probability of the **true** class: the rule of [2] as
    restated by [1] (Sec. 5, "Baselines"). No gradient flows through the
    choice of :math:`\gamma`; the loss jumps where :math:`p_y` crosses the
    threshold. The ACLS supplement [3], Eq. (1), writes the rule on the
    predicted class's :math:`p_{\hat y}`, which is not implemented.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      threshold: :math:`p_y` below which ``gamma_below`` is used; default 0.2.
      gamma_below: :math:`\gamma` for :math:`p_y <` ``threshold``; default 5.
      gamma_above: :math:`\gamma` for :math:`p_y \ge` ``threshold``; default 3.
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Sec. 5 (Baselines, "FL-53").
      [2] J. Mukhoti et al., "Calibrating Deep Neural Networks using Focal Loss",
      NeurIPS 2020, arXiv:2002.09437 (FLSD-53).
      [3] H. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
      Calibration", ICCV 2023, supplementary Eq. (1).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[0.5, 0.0, -0.5], [0.0, 2.0, 0.0]])
      >>> print(focal_adaptive(logits, jnp.array([0, 0])))  # gamma 3, then 5
      [0.08177007 1.2753096 ]
    """
    check_unit_interval("threshold", threshold, closed_left=True)
    check_nonnegative("gamma_below", gamma_below)
    check_nonnegative("gamma_above", gamma_above)
    logits, labels, mask = prepare(logits, labels, where)
    return _focal_adaptive(logits, labels, mask, threshold, gamma_below, gamma_above)


@jax.jit
def _focal_adaptive(logits, labels, mask, threshold, gamma_below, gamma_above):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    split = true_vs_rest(logits, labels)
    dtype = logits.dtype
    # The FLSD-53 rule is piecewise constant in p_y: no gradient through it.
    p_true = lax.stop_gradient(jnp.exp(split.log_p_true))
    gamma = jnp.where(
        p_true < jnp.asarray(threshold, dtype),
        jnp.asarray(gamma_below, dtype),
        jnp.asarray(gamma_above, dtype),
    )
    loss = -jnp.exp(gamma * split.log_1m_p_true) * split.log_p_true
    return zero_masked(loss, mask)


def inverse_focal(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    gamma: jax.typing.ArrayLike = 2.0,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Inverse focal loss, per-example.

    .. math::

        \ell_{\mathrm{IFL}}(z, y) = -(1 + p_y)^{\gamma} \log p_y,

    which, unlike :func:`focal`, up-weights confident samples (Wang et al.
    [2]; the form here is [1], Def. 3.2, Eq. (3)). :math:`\gamma = 0` is
    :func:`cross_entropy`.

    [1] selects :math:`\gamma` by cross-validation (App. E.1, Table 2: 1.0 to
    3.0); the default 2.0 is its value for ResNet-50 on CIFAR-10. For
    :math:`\gamma \gtrsim 3.5`-4 the gradient w.r.t. :math:`p_y` turns
    positive in places and training can fail ([1], App. C.2); nothing checks it.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      gamma: :math:`\gamma \ge 0` (traceable).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Def. 3.2, Eq. (3); App. C.2; App. E.1, Table 2.
      [2] D.-B. Wang, L. Feng, M.-L. Zhang, "Rethinking Calibration of Deep
      Neural Networks: Do Not Be Afraid of Overconfidence", NeurIPS 2021.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
      >>> print(inverse_focal(logits, jnp.array([0, 2]), gamma=2.0))
      [0.57740504 1.9530884 ]
    """
    check_nonnegative("gamma", gamma)
    logits, labels, mask = prepare(logits, labels, where)
    return _inverse_focal(logits, labels, mask, gamma)


@jax.jit
def _inverse_focal(logits, labels, mask, gamma):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    log_p = take_col(logits, labels) - jax.nn.logsumexp(logits, axis=1)
    gamma = jnp.asarray(gamma, logits.dtype)
    # log(1 + p_y) = softplus(log p_y).
    loss = -jnp.exp(gamma * jax.nn.softplus(log_p)) * log_p
    return zero_masked(loss, mask)


def dual_focal(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    gamma: jax.typing.ArrayLike = 5.0,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Dual focal loss, per-example.

    ``variant='paper'`` (default), Tao et al. [2] as restated in [1], Eq. (24):

    .. math::

        \ell_{\mathrm{DFL}}(z, y) = -(1 - p_y + p_{j^*})^{\gamma} \log p_y,
        \qquad j^* = \operatorname*{arg\,max}_{j \ne y} p_j,

    where :math:`p_{j^*}` is the largest **non-true-class** probability, so the
    weight grows as the margin :math:`p_y - p_{j^*}` shrinks. The gradient
    flows through :math:`p_{j^*}` (on a tie, through the first tied class).

    ``variant='released_code'`` computes the authors' code (repository
    Linwei94/ICML2023-DualFocalLoss, ``Losses/dual_focal_loss.py``, class
    ``DualFocalLoss``; han678/CalibWeightedRisk ``loss/dual_focal.py`` has the
    same arithmetic). Differences from the paper, one per line:

    * the competitor is the largest probability strictly below :math:`p_y`, not the largest non-true one;
    * on a misclassified row it is therefore a class ranked below the label, never the predicted class;
    * it is 0 when the label has the smallest probability (no class below);
    * classes tied with :math:`p_y` are never the competitor (the mask is ``p < p_y`` on float probabilities);
    * the gradient of the competitor goes to one index (``torch.topk``), here the first.

    ``1 - p_y`` is evaluated in log space (the released value without its
    float32 cancellation near :math:`p_y = 1`). All-equal logits give
    :math:`(1 - 1/K)^{\gamma}\log K`, where ``'paper'`` gives :math:`\log K`.

    ``variant='reweighted_risk_description'`` is what [1], App. C.3, Eqs.
    (25)-(26), *describes* for the dual-focal code (the code itself is
    ``'released_code'``): the competitor is dropped on misclassified samples,

    .. math::

        \ell = \begin{cases}
            -(1 - p_y + p_{j^*})^{\gamma}\log p_y, & \text{correct} \\
            -(1 - p_y)^{\gamma}\log p_y, & \text{misclassified},
        \end{cases}

    with "correct" the library's rule (the first arg-max index is the label);
    discontinuous where the prediction changes.

    [1] selects :math:`\gamma` by cross-validation (App. E.1, Table 2: 1.0 to
    6.1); the default 5.0 is its value for ResNet-50 on CIFAR-10 and CIFAR-100.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      gamma: :math:`\gamma \ge 0` (traceable).
      variant: static str, ``'paper'`` (Eq. (24) of [1]),
        ``'reweighted_risk_description'`` (Eqs. (25)-(26) of [1]) or
        ``'released_code'`` (the code of [2]).
      where: optional bool ``[B]``; ``False`` rows are ignored and get 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Eqs. (24)-(26) (App. C.3) and App. E.1, Table 2.
      [2] L. Tao, M. Dong, C. Xu, "Dual Focal Loss for Calibration",
      ICML 2023, PMLR 202:33833-33849; code: github.com/Linwei94/
      ICML2023-DualFocalLoss, ``Losses/dual_focal_loss.py``.

    Raises:
      ValueError: an unknown ``variant`` or ``gamma < 0``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 2.0, 0.0]])
      >>> print(dual_focal(logits, jnp.array([0, 0]), gamma=2.0))
      [0.01241853 6.324496  ]
      >>> print(dual_focal(logits, jnp.array([0, 0]), gamma=2.0,
      ...                  variant="reweighted_risk_description"))
      [0.01241853 1.7878953 ]
    """
    variant = check_variant(variant, _DUAL_VARIANTS)
    check_nonnegative("gamma", gamma)
    logits, labels, mask = prepare(logits, labels, where)
    if variant == "released_code":
        logits, labels = zero_excluded_rows(logits, labels, mask)
        return _dual_focal_released(logits, labels, mask, gamma)
    return _dual_focal(logits, labels, mask, gamma, variant=variant)


@functools.partial(jax.jit, static_argnames="variant")
def _dual_focal(logits, labels, mask, gamma, *, variant):
    logits, labels = zero_excluded_rows(logits, labels, mask)
    z_true, z_rest_max, rest_sum, first = dual_parts(logits, labels)
    # log sum_{k != y} e^{z_k}; a constant shift, as in true_vs_rest.
    lse_rest = lax.stop_gradient(z_rest_max) + jnp.log(rest_sum)
    d = z_true - lse_rest  # log-odds of the true class against the rest
    log_p_true = jax.nn.log_sigmoid(d)
    log_1m_p_true = jax.nn.log_sigmoid(-d)
    # log p_j* = z_j* - lse, lse = z_y - log p_y.
    log_p_rest_max = z_rest_max - z_true + log_p_true
    gamma = jnp.asarray(gamma, logits.dtype)
    # log(1 - p_y + p_j*), both terms finite in log space.
    log_base = jnp.logaddexp(log_1m_p_true, log_p_rest_max)
    if variant == "reweighted_risk_description":
        # [1], Eqs. (25)-(26): p_j* is dropped on misclassified samples (on a
        # tie z_y == z_j*, correct iff the label is the first arg-max).
        correct = lax.stop_gradient(
            (z_true > z_rest_max) | ((z_true == z_rest_max) & (labels < first))
        )
        log_base = jnp.where(correct, log_base, log_1m_p_true)
    loss = -jnp.exp(gamma * log_base) * log_p_true
    return zero_masked(loss, mask)


@jax.jit
def _dual_focal_released(logits, labels, mask, gamma):
    # Shifted by the constant row max (1e4 logits lose 3 digits in float32).
    z = logits - lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    p = jax.nn.softmax(z, axis=1)
    p_y = take_col(p, labels)
    # The released mask compares probabilities (torch.lt(p, p_y)); entries at
    # or above p_y, the label's own included, count as 0 in the top-1.
    below = lax.stop_gradient(p < p_y[:, None])
    cand = jnp.where(below, p, 0.0)
    idx = jnp.argmax(lax.stop_gradient(cand), axis=1).astype(jnp.int32)
    p_j = take_col(cand, idx)
    # log p_y, 1 - p_y from the log-odds of the label (see the docstring).
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    d = take_col(z, labels) - jax.nn.logsumexp(rest, axis=1)
    log_py = jax.nn.log_sigmoid(d)
    one_minus_py = jnp.exp(jax.nn.log_sigmoid(-d))
    base = one_minus_py + p_j
    loss = -(base ** jnp.asarray(gamma, z.dtype)) * log_py
    return zero_masked(loss, mask)


@kernels.dispatch("loss_dual_focal", _cpu_kernels.dual_parts)
def dual_parts(z, labels):
    """``(z_y, z_j*, sum_{k != y} e^{z_k - z_j*}, j*)`` per row, ``j*`` the first
    non-true arg-max (int32); ``stop_gradient(z_j*) + log(sum)`` is the
    log-sum-exp of the rest with its exact derivatives."""
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    first = first_index(rest, jnp.max(rest, axis=1))
    z_rest_max = take_col(z, first)
    e = jnp.exp(rest - lax.stop_gradient(z_rest_max)[:, None])
    return take_col(z, labels), z_rest_max, jnp.sum(e, axis=1), first
