r"""AURC as a training loss (Zhou et al. 2025, Def. 3.3; Geifman et al. 2019)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _cpu_kernels
from calib_jax.losses._base import row_stats, zero_excluded_logits
from calib_jax.losses._confidence import check_csf, csf_flags, csf_score
from calib_jax.losses._validation_base import prepare


def aurc(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    csf: str = "msp",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Empirical AURC of the cross-entropy, as a training loss (batch-level).

    Def. 3.3 of [1] writes the AURC as the reweighted risk
    :math:`-\mathbb{E}[\ln(1 - G(x))\,\ell(f(x), y)]`, :math:`G` the CDF of
    the confidence score. With the batch ranked by decreasing score (rank
    :math:`r_i = 1` the most confident), its exact finite-sample weight is

    .. math::

        \alpha_i = \sum_{m=r_i}^{n} \frac{1}{m}, \qquad
        \mathrm{AURC} = \frac{1}{n}\sum_{i=1}^{n} \alpha_i\,\ell_i
        = \frac{1}{n}\sum_{m=1}^{n}\ \frac{1}{m}\sum_{i:\,r_i \le m} \ell_i,

    the mean over the :math:`n` coverages :math:`m/n` of the selective risk
    (Eq. (5) of [1]). Tied scores share the mean :math:`\alpha` of their group.
    :math:`\ell_i = -\log p_{y_i}` ([1] keeps :math:`\ell` generic, Sec. 3.1;
    the 0/1 AURC *metric* is ``calib_jax.metrics.aurc``). The weights carry no
    gradient: the gradient is :math:`\frac{1}{n}\sum_i \alpha_i \nabla \ell_i`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      csf: static str, the confidence score ranking the samples: ``'msp'``,
        ``'neg_entropy'`` or ``'softmax_margin'``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (0 for an empty batch; global
      under data-sharded jit).

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Def. 3.3 and Eq. (5).
      [2] Y. Geifman, G. Uziel, R. El-Yaniv, "Bias-Reduced Uncertainty
      Estimation for Deep Neural Classifiers", ICLR 2019 (the AURC).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0]])
      >>> print(f"{float(aurc(logits, jnp.array([0, 0, 0]))):.4f}")
      0.4950
    """
    csf = check_csf(csf)
    logits, labels, mask = prepare(logits, labels, where)
    if logits.shape[0] == 0:
        return jnp.zeros((), logits.dtype)
    return _aurc(logits, labels, mask, csf=csf)


@functools.partial(jax.jit, static_argnames=("csf",))
def _aurc(logits, labels, mask, *, csf):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, ce=True, **csf_flags(csf))
    dtype = logits.dtype
    ce = jnp.where(mask, rows.ce, 0.0)
    # G, the CDF in the weight -ln(1 - G) of Def. 3.3, enters only through the
    # ranking, which is piecewise constant: no gradient flows through it.
    score = lax.stop_gradient(csf_score(csf, rows))
    # Descending score, excluded rows last; + 0.0 maps -0.0 to +0.0 so that
    # equal scores get equal keys.
    first, new_group = tie_groups(jnp.where(mask, -score, jnp.inf) + 0.0)
    b = score.shape[0]
    n = jnp.sum(mask.astype(dtype))
    rank = jnp.arange(1, b + 1, dtype=dtype)
    inv = jnp.where(rank <= n, 1.0 / rank, 0.0)
    # alpha_r = sum_{m=r}^{n} 1/m, summed from the small end for accuracy.
    alpha = jnp.cumsum(inv[::-1])[::-1]
    group = jnp.cumsum(new_group.astype(jnp.int32)) - 1
    group_sum = jax.ops.segment_sum(alpha, group, num_segments=b)
    group_size = jax.ops.segment_sum(jnp.ones_like(alpha), group, num_segments=b)
    alpha = (group_sum / jnp.maximum(group_size, 1.0))[group[first]]
    return jnp.sum(alpha * ce) / jnp.maximum(n, 1.0)


@kernels.dispatch("sort_keys", _cpu_kernels.tie_groups)
def tie_groups(x):
    """``(first, new_group)`` of ascending ``x``: each sample's first sorted
    position in its tie group (binary search), and the group starts."""
    x_sorted = lax.sort(x)
    first = jnp.searchsorted(x_sorted, x, side="left", method="scan")
    new_group = jnp.concatenate([jnp.ones((1,), bool), x_sorted[1:] != x_sorted[:-1]])
    return first, new_group
