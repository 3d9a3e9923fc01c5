r"""AURC as a training loss (Zhou et al. 2025, Def. 3.3; Geifman et al. 2019).

A batch-level reweighted risk :math:`\frac{1}{n}\sum_i \alpha_i \ell_i`
whose weights depend on the rank of the confidence score :math:`g(z_i)` in
the batch; the only loss of the package that sorts over the batch.
"""

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

    Definition 3.3 of [1] writes the area under the risk–coverage curve as the
    reweighted risk :math:`-\mathbb{E}[\ln(1 - G(x))\,\ell(f(x), y)]`, with
    :math:`G` the CDF of the confidence score :math:`g`. On a batch of :math:`n`
    samples ranked by decreasing score (rank :math:`r_i = 1` is the most
    confident), the exact finite-sample counterpart of that weight is the
    harmonic tail

    .. math::

        \alpha_i = \sum_{m=r_i}^{n} \frac{1}{m}, \qquad
        \mathrm{AURC} = \frac{1}{n}\sum_{i=1}^{n} \alpha_i\,\ell_i
        = \frac{1}{n}\sum_{m=1}^{n}\ \frac{1}{m}\sum_{i:\,r_i \le m} \ell_i,

    i.e. exactly the mean over the :math:`n` coverages :math:`m/n` of the
    selective risk (Eq. (5) of [1]) of the :math:`m` most confident samples.
    :math:`\alpha_i \approx -\ln((r_i - 1)/n) = -\ln(1 - G(x_i))` for large
    :math:`n`; the plug-in :math:`-\ln(1-\hat G)` itself is infinite for the top
    sample, so the harmonic form is used. Samples with tied scores get the mean of
    their group's :math:`\alpha` (the expectation over random tie-breaking), which
    keeps the loss permutation invariant.

    The per-sample loss :math:`\ell_i` is the cross-entropy
    :math:`-\log p_{y_i}`: [1] keeps :math:`\ell` generic ("such as
    cross-entropy", Sec. 3.1) and trains AURC as a baseline loss, which needs a
    differentiable :math:`\ell` (the 0/1 loss of the AURC *metric* has no
    gradient; ``calib_jax.metrics`` evaluates that one). The weights
    depend on the batch only through the ranking, which is piecewise constant:
    they carry no gradient (``stop_gradient`` on the score), so the gradient is
    :math:`\frac{1}{n}\sum_i \alpha_i \nabla \ell_i`.

    This is the only loss of the package that sorts over the batch
    (:math:`O(n\log n)`); :func:`au_pxtau` avoids the sort.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      csf: static str, the confidence score ranking the samples: ``'msp'``,
        ``'neg_entropy'`` or ``'softmax_margin'``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch; global-batch semantics under
      data-sharded jit (the sort spans all devices).

    References:
      [1] H. Zhou, S. G. Gruber, T. Popordanoska, M. B. Blaschko, "Revisiting
      Reweighted Risk for Calibration: AURC, Focal and Inverse Focal Loss", 2025,
      Def. 3.3 and Eq. (5).
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
    if logits.shape[0] == 0:  # an empty batch: 0, like every batch-level loss
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
    # Tied scores share the mean alpha of their group.
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
