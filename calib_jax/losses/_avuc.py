r"""Accuracy-versus-uncertainty calibration losses: AvUC, AvUC-GS and S-AvUC
(Karandikar et al. 2021, Eqs. (13)-(16))."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._base import row_stats, zero_excluded_logits
from calib_jax.losses._validation_base import (
    check_open_unit_interval,
    check_positive,
    check_unit_interval,
    prepare,
)

# Keeps the count ratio finite when n_AC + n_IU == 0 (all wrong and certain).
_EPS = 1e-10


def _ratio_loss(bad: jax.Array, good: jax.Array) -> jax.Array:
    """``log(1 + bad / good)`` as ``log(bad + good + eps) - log(good + eps)``."""
    return jnp.log(bad + good + _EPS) - jnp.log(good + _EPS)


def _inputs(logits, labels, mask, *, with_conf):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, conf=with_conf, entropy=True)
    acc = jnp.where(mask, rows.correct, 0.0)
    inacc = jnp.where(mask, 1.0 - rows.correct, 0.0)
    h_norm = rows.entropy / math.log(logits.shape[-1])
    return rows.conf, acc, inacc, rows.entropy, h_norm


@functools.partial(jax.jit, static_argnames=("stop_confidence",))
def _hard_avuc(logits, labels, mask, kappa, *, stop_confidence):
    conf, acc, inacc, h, h_norm = _inputs(logits, labels, mask, with_conf=True)
    if stop_confidence:
        # App. F (AvUC-GS): no gradient through the c_i and (1 - c_i)
        # multiplicands of Eq. (14); only tanh(h_i) is differentiated.
        conf = lax.stop_gradient(conf)
    unc = (h_norm > jnp.asarray(kappa, h_norm.dtype)).astype(h.dtype)
    cert = 1.0 - unc
    th = jnp.tanh(h)
    n_au = jnp.sum(acc * unc * conf * th)
    n_ic = jnp.sum(inacc * cert * (1.0 - conf) * (1.0 - th))
    n_ac = jnp.sum(acc * cert * conf * (1.0 - th))
    n_iu = jnp.sum(inacc * unc * (1.0 - conf) * th)
    return _ratio_loss(n_au + n_ic, n_ac + n_iu)


def avuc(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    kappa: jax.typing.ArrayLike = 0.5,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Accuracy-versus-uncertainty calibration loss AvUC (batch-level).

    .. math::

        \mathrm{AvUC} = \log\Big(1 + \frac{n_{AU} + n_{IC}}{n_{AC} + n_{IU}}\Big)
        \qquad \text{(Eq. (13) of [1])}

    with the relaxed counts of Eq. (14) of [1] (restating [2])

    .. math::

        n_{AU} = \sum_{i \in AU} c_i \tanh h_i, \quad
        n_{IC} = \sum_{i \in IC} (1 - c_i)(1 - \tanh h_i),

        n_{AC} = \sum_{i \in AC} c_i (1 - \tanh h_i), \quad
        n_{IU} = \sum_{i \in IU} (1 - c_i) \tanh h_i,

    with confidence :math:`c_i = \max_k p_{ik}`, predictive entropy
    :math:`h_i = -\sum_k p_{ik}\log p_{ik}` (nats), accurate meaning the first
    arg-max index is :math:`y_i`, and uncertain meaning :math:`h_i / \log K >
    \kappa`. [1] (Sec. 4.2, App. F) finds that this loss rewards more
    confidence in inaccurate-certain and less in accurate-uncertain
    predictions; see :func:`avuc_gs` and :func:`s_avuc`.

    The threshold is on the normalised entropy (the raw-entropy threshold of
    [1, 2] is :math:`\kappa \log K`); neither paper gives a value, so
    ``kappa=0.5`` is this library's. The :math:`\tanh` is of the raw entropy,
    as printed. The ratio is a difference of logs with :math:`\epsilon =
    10^{-10}` added to both sums (finite when :math:`n_{AC} + n_{IU} = 0`). The
    hard split carries no gradient.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, ``K >= 2``.
      labels: int ``[B]`` class ids in ``[0, K)``.
      kappa: threshold :math:`\kappa \in [0, 1]` on the normalised entropy.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``kappa`` outside [0, 1] or fewer than 2 classes.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, Eqs. (13)–(14), Sec. 4.2.
      [2] R. Krishnan, O. Tickoo, "Improving Model Calibration with Accuracy
      versus Uncertainty Optimization", NeurIPS 2020, arXiv:2012.07923.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(avuc(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.2406
    """
    check_unit_interval("kappa", kappa, closed_left=True)
    logits, labels, mask = prepare(logits, labels, where)
    return _hard_avuc(logits, labels, mask, kappa, stop_confidence=False)


def avuc_gs(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    kappa: jax.typing.ArrayLike = 0.5,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""AvUC with gradient stopping, AvUC-GS (batch-level).

    Same value as :func:`avuc`; App. F of [1] stops the gradient through the
    :math:`c_i` and :math:`(1 - c_i)` multiplicands of all four counts, so the
    gradient flows only through :math:`\tanh h_i` (it is not the derivative of
    the value, by design). Counts, threshold, default ``kappa=0.5`` and
    :math:`\epsilon` are those of :func:`avuc`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, ``K >= 2``.
      labels: int ``[B]`` class ids in ``[0, K)``.
      kappa: threshold :math:`\kappa \in [0, 1]` on the normalised entropy.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``kappa`` outside [0, 1] or fewer than 2 classes.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, App. F (Eqs. (13)–(14)).
      [2] R. Krishnan, O. Tickoo, "Improving Model Calibration with Accuracy
      versus Uncertainty Optimization", NeurIPS 2020, arXiv:2012.07923.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(avuc_gs(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.2406
    """
    check_unit_interval("kappa", kappa, closed_left=True)
    logits, labels, mask = prepare(logits, labels, where)
    return _hard_avuc(logits, labels, mask, kappa, stop_confidence=True)


def soft_uncertainty(
    h_norm: jax.Array, kappa: jax.typing.ArrayLike, temperature: jax.typing.ArrayLike
) -> jax.Array:
    r"""Soft uncertainty :math:`t_{\kappa,T}(h^*)` of Sec. 4.2 of [1].

    .. math::

        t_{\kappa,T}(h^*) = \operatorname{logistic}\Big(\frac{1}{T}
        \log\frac{h^*(1 - \kappa)}{(1 - h^*)\kappa}\Big)

    It tends to :math:`1[h^* > \kappa]` as :math:`T \to 0` and is the identity
    for :math:`\kappa = 1/2, T = 1`. :math:`h^*` is clipped to
    :math:`[10^{-30}, 1 - \epsilon_{\text{mach}}]` (finite at 0 and 1).

    Args:
      h_norm: float ``[B]`` normalised entropies :math:`h^* = h/\log K`.
      kappa: soft threshold in (0, 1).
      temperature: sharpness :math:`T > 0`.

    Returns:
      ``[B]`` values in [0, 1].

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, Sec. 4.2 (Fig. 4).
    """
    dtype = h_norm.dtype
    hi = 1.0 - jnp.finfo(dtype).eps
    x = jnp.clip(h_norm, 1e-30, hi)
    kappa = jnp.asarray(kappa, dtype)
    logit = jnp.log(x) - jnp.log1p(-x) + jnp.log1p(-kappa) - jnp.log(kappa)
    return jax.nn.sigmoid(logit / jnp.asarray(temperature, dtype))


def s_avuc(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    kappa: jax.typing.ArrayLike = 0.5,
    temperature: jax.typing.ArrayLike = 1.0,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Soft AvUC, S-AvUC (batch-level).

    Eqs. (15)–(16) of [1]: AvUC's hard split and confidence multiplicands are
    replaced by the soft uncertainty :math:`t_i = t_{\kappa,T}(h_i/\log K)`
    (:func:`soft_uncertainty`):

    .. math::

        \text{S-AvUC} = \log\Big(1 + \frac{n'_{AU} + n'_{IC}}{n'_{AC} + n'_{IU}}
        \Big),

        n'_{AU} = \sum_{i:\,a_i=1} t_i \tanh h_i, \quad
        n'_{IC} = \sum_{i:\,a_i=0} (1 - t_i)(1 - \tanh h_i),

        n'_{AC} = \sum_{i:\,a_i=1} (1 - t_i)(1 - \tanh h_i), \quad
        n'_{IU} = \sum_{i:\,a_i=0} t_i \tanh h_i,

    with :math:`a_i` the hard correctness (no gradient) and :math:`h_i` the raw
    entropy in nats, as printed. [1] reports no :math:`\kappa`, :math:`T` (App.
    G); ``kappa=0.5, temperature=1`` makes :math:`t` the identity (Sec. 4.2).
    The ratio is evaluated as in :func:`avuc` (:math:`\epsilon = 10^{-10}`).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, ``K >= 2``.
      labels: int ``[B]`` class ids in ``[0, K)``.
      kappa: soft entropy threshold :math:`\kappa \in (0, 1)` (Sec. 4.2 of [1]).
      temperature: sharpness :math:`T > 0` of the soft threshold.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``kappa`` outside (0, 1), ``temperature <= 0`` or fewer than
        2 classes.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural Networks",
      NeurIPS 2021, Eqs. (15)–(16), Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(s_avuc(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.1613
    """
    check_open_unit_interval("kappa", kappa)
    check_positive("temperature", temperature)
    logits, labels, mask = prepare(logits, labels, where)
    return _s_avuc(logits, labels, mask, kappa, temperature)


@jax.jit
def _s_avuc(logits, labels, mask, kappa, temperature):
    _, acc, inacc, h, h_norm = _inputs(logits, labels, mask, with_conf=False)
    t = soft_uncertainty(h_norm, kappa, temperature)
    th = jnp.tanh(h)
    n_au = jnp.sum(acc * t * th)
    n_ic = jnp.sum(inacc * (1.0 - t) * (1.0 - th))
    n_ac = jnp.sum(acc * (1.0 - t) * (1.0 - th))
    n_iu = jnp.sum(inacc * t * th)
    return _ratio_loss(n_au + n_ic, n_ac + n_iu)
