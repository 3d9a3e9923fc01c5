r"""Maximum mean calibration error, MMCE (Kumar, Sarawagi & Jain 2018)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax.losses._base import (
    row_stats,
    safe_pow,
    zero_excluded_logits,
)
from calib_jax.losses._validation_base import (
    check_positive,
    check_variant,
    prepare,
    reject,
)

_MMCE_EPS = 1e-5  # 20ng_mmce.py: added to m^2, n^2, m n
_MMCE_SQRT_EPS = 1e-10  # 20ng_mmce.py: added under the square root


def mmce(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    bandwidth: jax.typing.ArrayLike = 0.4,
    weighted: bool = False,
    squared: bool = False,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Kernel maximum mean calibration error of the top label (batch-level).

    With confidence :math:`r_i = \max_k p_{ik}`, hard correctness :math:`c_i`
    (no gradient; the first arg-max index is the label) and the Laplacian kernel
    :math:`k(r, r') = \exp(-|r - r'|/\text{bandwidth})`, the minibatch estimator
    of [1] over the :math:`N` unmasked samples is

    .. math::

        \mathrm{MMCE}^2 = \frac{1}{N^2}\sum_{i,j}(c_i - r_i)(c_j - r_j)\,
            k(r_i, r_j),

    and the weighted variant (``weighted=True``, :math:`\mathrm{MMCE}_w`) splits
    the batch into its :math:`m` correct (:math:`\mathcal C`) and :math:`N - m`
    incorrect (:math:`\mathcal I`) samples and normalises each group by its own
    size,

    .. math::

        \mathrm{MMCE}_w^2 = \sum_{i,j\in\mathcal C}
            \frac{(1-r_i)(1-r_j)k(r_i,r_j)}{m^2}
        + \sum_{i,j\in\mathcal I}\frac{r_i r_j k(r_i,r_j)}{(N-m)^2}
        - 2\sum_{i\in\mathcal C,\,j\in\mathcal I}
            \frac{(1-r_i)\,r_j\,k(r_i,r_j)}{m(N-m)},

    an empty group contributing nothing. Both build an ``[N, N]`` kernel matrix.

    [1] trains with :math:`\lambda\,\mathrm{MMCE}`, the square root of the
    double sum, so that is the default (subgradient 0 at 0); ``squared=True``
    returns the double sum, smooth everywhere. ``bandwidth=0.4`` is [1]'s.

    ``variant='released_code'`` (``weighted=True`` only) computes the authors'
    ``calibration_mmce_w_loss`` (aviralkumar2907/MMCE, ``20ng_mmce.py``):

    .. math::

        \sqrt{\frac{\bar S_{\mathcal C\mathcal C}}{m^2 + 10^{-5}}
        + \frac{\bar S_{\mathcal I\mathcal I}}{n^2 + 10^{-5}}
        - \frac{2\,\bar S_{\mathcal C\mathcal I}}{mn + 10^{-5}} + 10^{-10}},

    with :math:`n = N - m` and :math:`\bar S` the *mean* of each weighted
    kernel block. Differences from the paper, one per line:

    * every block is normalised twice (its mean, then :math:`1/m^2`, :math:`1/n^2`, :math:`1/(mn)`), i.e. by :math:`m^4`, :math:`n^4`, :math:`m^2n^2`;
    * :math:`10^{-5}` is added to :math:`m^2`, :math:`n^2`, :math:`mn`, and :math:`10^{-10}` under the root;
    * the value is 0 (with zero gradient) when the batch has no correct or no incorrect sample;
    * only the root exists (``squared=True`` raises), and only the weighted form (``weighted=False`` raises; the released unweighted MMCE returns the double sum, ``squared=True`` here).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      bandwidth: Laplacian kernel width :math:`> 0`.
      weighted: static bool, the weighted estimator :math:`\mathrm{MMCE}_w`.
      squared: static bool, return :math:`\mathrm{MMCE}^2` instead of its root.
      variant: static str, ``'paper'`` or ``'released_code'`` (see above).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``bandwidth <= 0``, an unknown ``variant``, or
        ``variant='released_code'`` with ``weighted=False`` or ``squared=True``.

    References:
      [1] A. Kumar, S. Sarawagi, U. Jain, "Trainable Calibration Measures for
      Neural Networks from Kernel Mean Embeddings", ICML 2018, Secs. 3-4.
      Code: github.com/aviralkumar2907/MMCE, ``20ng_mmce.py``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(mmce(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.2935
    """
    check_positive("bandwidth", bandwidth)
    variant = check_variant(variant)
    if variant == "released_code":
        if not weighted:
            reject("mmce", "weighted=False (use squared=True for MMCE_m)")
        if squared:
            reject("mmce", "squared=True (it returns the root)")
    logits, labels, mask = prepare(logits, labels, where)
    if variant == "released_code":
        return _mmce_released(logits, labels, mask, bandwidth)
    return _mmce(
        logits, labels, mask, bandwidth, weighted=bool(weighted), squared=bool(squared)
    )


@functools.partial(jax.jit, static_argnames=("weighted", "squared"))
def _mmce(logits, labels, mask, bandwidth, *, weighted, squared):
    logits = zero_excluded_logits(logits, mask)
    dtype = logits.dtype
    rows = row_stats(logits, labels, conf=True)
    r, c = rows.conf, rows.correct
    mf = mask.astype(dtype)
    if weighted:
        m_c = jnp.sum(mf * c)
        m_i = jnp.sum(mf * (1.0 - c))
        v = mf * (
            c * (1.0 - r) / jnp.maximum(m_c, 1.0)
            - (1.0 - c) * r / jnp.maximum(m_i, 1.0)
        )
    else:
        v = jnp.where(mask, c - r, 0.0) / jnp.maximum(jnp.sum(mf), 1.0)
    kernel = jnp.exp(-jnp.abs(r[:, None] - r[None, :]) / jnp.asarray(bandwidth, dtype))
    sq = jnp.maximum(jnp.sum(v * (kernel @ v)), 0.0)
    return sq if squared else safe_pow(sq, 0.5)


@jax.jit
def _mmce_released(logits, labels, mask, bandwidth):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, conf=True)
    r, c = rows.conf, rows.correct
    dtype = r.dtype
    mf = mask.astype(dtype)
    cm = c * mf
    im = (1.0 - c) * mf
    m = jnp.sum(cm)
    n = jnp.sum(im)
    kernel = jnp.exp(-jnp.abs(r[:, None] - r[None, :]) / jnp.asarray(bandwidth, dtype))
    u = cm * (1.0 - r)  # correct rows: 1 - r
    v = im * r  # incorrect rows: r
    s_cc = jnp.sum(u * (kernel @ u))
    s_ii = jnp.sum(v * (kernel @ v))
    s_ci = jnp.sum(u * (kernel @ v))
    # The first normalisation: the mean of each weighted kernel block ...
    m1 = jnp.maximum(m, 1.0)
    n1 = jnp.maximum(n, 1.0)
    cc = s_cc / (m1 * m1)
    ii = s_ii / (n1 * n1)
    ci = s_ci / (m1 * n1)
    # ... then the second: division by m^2, n^2, m n (plus 1e-5).
    mmd = (
        cc / (m * m + _MMCE_EPS)
        + ii / (n * n + _MMCE_EPS)
        - 2.0 * ci / (m * n + _MMCE_EPS)
    )
    both = (m > 0) & (n > 0)
    root = jnp.sqrt(jnp.where(both, mmd, 0.0) + _MMCE_SQRT_EPS)
    return jnp.where(both, root, jnp.zeros_like(root))
