r"""Logit-margin and pairwise regularizers: MbLS, ACLS and CPC.

Each function returns only its penalty, per example; the composition in
:mod:`calib_jax.losses` adds the primary loss (cross-entropy in all three
papers). :func:`acls_logit_grad` returns the ACLS paper's closed-form logit
gradient (its Eq. (12)), which is *not* the gradient of its Eq. (13); see
:func:`acls`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses import _released
from calib_jax.losses._common import (
    _no_tangent,
    _row_reduce,
    _unfused,
    check_nonnegative,
    prepare,
    zero_masked,
)
from calib_jax.losses._primary import (
    _check_num_classes,
    _clean,
    _first_index,
    _take_col,
)

# Largest [B, block, K] pairwise slab CPC materialises at once (elements).
_PAIR_BLOCK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------
# MbLS.
# ---------------------------------------------------------------------------


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
    \alpha`). ``alpha`` multiplies the whole sum over classes (equivalently
    each hinge); it is a **sum** over the :math:`K` classes, not a mean (an
    implementation that averages over classes has an effective
    :math:`\alpha/K`). The :math:`k = \arg\max` term is
    :math:`\max(0, -m) = 0`. Labels are not used: the penalty depends on the
    logits only. The primary loss (cross-entropy in [1]) is not included.

    Gradient: :math:`\max_j z_j` is differentiated too, so the arg-max logit
    receives :math:`+\alpha` per active hinge (on a tie for the maximum, the
    first maximal class does; ``jnp.max`` would split it). The gradient
    analysis of [2]
    (Eqs. (15)-(17)) reports a zero penalty gradient for the arg-max logit,
    i.e. it treats :math:`\max_j z_j` as a constant; that differs from the
    derivative of the formula, which is what is implemented.

    Defaults: :math:`m = 10`, :math:`\alpha = 0.1`, the values of [1] (the
    ACLS paper [2] follows [1] and uses :math:`m = 6` on CIFAR-10 only).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)`` (only checked, not used).
      margin: :math:`m \ge 0` (traceable).
      alpha: weight :math:`\alpha \ge 0` (traceable).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] B. Liu, I. Ben Ayed, A. Galdran, J. Dolz, "The Devil is in the
      Margin: Margin-based Label Smoothing for Network Calibration",
      CVPR 2022.
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
    _check_num_classes(logits)
    return _mbls(logits, labels, mask, margin, alpha)


@jax.jit
def _mbls(logits, labels, mask, margin, alpha):
    logits, _ = _clean(logits, labels, mask)
    dtype = logits.dtype
    _, hinge, _, _ = kernels.select(
        "loss_mbls", _mbls_parts, _mbls_parts_plain, logits, jnp.asarray(margin, dtype)
    )
    return zero_masked(jnp.asarray(alpha, dtype) * hinge, mask)


@jax.custom_jvp
def _mbls_parts(z, margin):
    """``(top, hinge, count, first)`` per row: the max logit, the hinge sum
    ``sum_k ReLU(top - z_k - margin)``, the number of active hinges (int32) and
    the first arg-max (int32).

    One max pass and one fused pass over ``[B, K]``; the derivative is stated
    in the rule below (``top`` moves with the first arg-max), so the backward
    pass is a single elementwise pass.

    Kernel family ``'loss_mbls'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`_mbls_parts_plain`; float64 reference in
    ``tests/_reference.py``.
    """
    k = z.shape[1]
    top = _unfused(jnp.max(z, axis=1))
    gap = top[:, None] - z - margin
    active = gap > 0
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    hinge, count, first = _row_reduce(
        (
            jnp.where(active, gap, 0.0),
            active.astype(jnp.int32),
            jnp.where(z == top[:, None], cols, k),
        ),
        (0, 0, k),
        (lax.add, lax.add, lax.min),
    )
    return top, hinge, count, first


def _first_max(z):
    """``(max_k z_k, first arg-max)``; the max moves with the first arg-max."""
    first = jnp.argmax(z, axis=1).astype(jnp.int32)
    return _take_col(z, first), first


def _mbls_parts_plain(z, margin):
    """Plain :func:`_mbls_parts`: ``argmax`` and a ReLU sum, JAX autodiff."""
    top, first = _first_max(z)
    gap = top[:, None] - z - margin
    active = gap > 0
    hinge = jnp.sum(jnp.where(active, gap, 0.0), axis=1)
    return top, hinge, jnp.sum(active.astype(jnp.int32), axis=1), first


@_mbls_parts.defjvp
def _mbls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = _mbls_parts(z, margin)
    top, _, count, first = out
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    active = top[:, None] - z - margin > 0
    dtop = jnp.sum(jnp.where(cols == first[:, None], dz, 0.0), axis=1)
    # d sum_{k active} (top - z_k - m) = count (dtop - dm) - sum_{k active} dz_k.
    dhinge = count.astype(z.dtype) * (dtop - dmargin) - jnp.sum(
        jnp.where(active, dz, 0.0), axis=1
    )
    return out, (dtop, dhinge, _no_tangent(count), _no_tangent(first))


# ---------------------------------------------------------------------------
# ACLS.
# ---------------------------------------------------------------------------


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

    Eq. (13) of [1], summed over the classes :math:`j` (the equation lists
    the two per-class cases), with :math:`\hat y = \arg\max_k z_k` the
    **predicted** class:

    .. math::

        R_{\mathrm{ACLS}}(z) =
            \lambda_1\,\mathrm{ReLU}\bigl(z_{\hat y} - \min_k z_k - M\bigr)^2
            + \lambda_2 \sum_{j \ne \hat y}
              \mathrm{ReLU}\bigl(z_{\hat y} - z_j - M\bigr)^2 .

    Labels are not used (the paper's penalty depends on the prediction, not
    the ground truth). The primary loss of [1], Eq. (14), cross-entropy, is
    not included.

    **Eq. (13) versus Eq. (12).** [1] states Eq. (13) as the integral of its
    logit gradient Eq. (12), but the exact gradient of Eq. (13), which is what
    ``jax.grad`` of this function gives, differs from Eq. (12)
    (:func:`acls_logit_grad`) in two ways:

    * a factor 2 (:math:`\partial_x \mathrm{ReLU}(x)^2 = 2\,\mathrm{ReLU}(x)`);
    * cross terms: :math:`z_{\hat y}` also appears in the :math:`j \ne \hat y`
      terms and :math:`\min_k z_k` in the :math:`\hat y` term, so
      :math:`\partial R/\partial z_{\hat y}` gains
      :math:`2\lambda_2\sum_{j \ne \hat y}\mathrm{ReLU}(z_{\hat y} - z_j - M)`
      and the arg-min logit gains
      :math:`-2\lambda_1\mathrm{ReLU}(z_{\hat y} - \min_k z_k - M)`.

    On ties for the maximum (minimum) the gradient of that term goes to the
    first maximal (minimal) class, which is also the :math:`\hat y` used.

    Eq. (12) is exactly :math:`\tfrac12\nabla` of Eq. (13) with
    ``stop_gradient`` on :math:`\min_k z_k` in the first term and on
    :math:`z_{\hat y}` in the second. This function implements Eq. (13) as
    written, with its full gradient.

    ``variant='released_code'`` computes the regularizer of the authors' code
    (repository cvlab-yonsei/ACLS, file ``calibrate/losses/acls.py``, method
    ``ACLS.get_reg``), per row so that its batch mean is the released value:

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

    Defaults: :math:`M = 10`, :math:`\lambda_1 = 0.1`, :math:`\lambda_2 =
    0.01` ([1], Sec. 4.1 and supplementary S2.2; [1] uses :math:`M = 6` on
    CIFAR-10).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)`` (only checked, not used).
      margin: :math:`M \ge 0` (traceable).
      lambda_1: weight of the predicted-class term, :math:`\ge 0`.
      lambda_2: weight of the other-class terms, :math:`\ge 0`.
      variant: static str, ``'paper'`` (Eq. (13) of [1]) or
        ``'released_code'`` (the code of [1], see above).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      Eqs. (10)-(14), Sec. 4.1; supplementary Sec. S2.2. Code:
      github.com/cvlab-yonsei/ACLS, ``calibrate/losses/acls.py``.

    Raises:
      ValueError: a negative ``margin``/``lambda_1``/``lambda_2`` or an
        unknown ``variant`` (the valid ones are listed).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[13.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
      >>> penalty = acls(logits, jnp.array([0, 0]))  # 0.1*3**2 + 0.01*(9 + 4)
      >>> print(jnp.round(penalty, 5))
      [1.03 0.  ]
    """
    variant = _released.check_variant(variant)
    check_nonnegative("margin", margin)
    check_nonnegative("lambda_1", lambda_1)
    check_nonnegative("lambda_2", lambda_2)
    logits, labels, mask = prepare(logits, labels, where)
    _check_num_classes(logits)
    if variant == "released_code":
        logits, _ = _clean(logits, labels, mask)
        return _released.acls(logits, mask, margin, lambda_1, lambda_2)
    return _acls(logits, labels, mask, margin, lambda_1, lambda_2)


@jax.jit
def _acls(logits, labels, mask, margin, lambda_1, lambda_2):
    logits, _ = _clean(logits, labels, mask)
    dtype = logits.dtype
    margin = jnp.asarray(margin, dtype)
    top, low, _, neg, _, _, _ = kernels.select(
        "loss_acls", _acls_parts, _acls_parts_plain, logits, margin
    )
    pos = jax.nn.relu(top - low - margin) ** 2
    penalty = jnp.asarray(lambda_1, dtype) * pos + jnp.asarray(lambda_2, dtype) * neg
    return zero_masked(penalty, mask)


@jax.custom_jvp
def _acls_parts(z, margin):
    """Per-row statistics of ACLS, Eq. (13): ``(top, low, hinge, neg, first_max,
    first_min, count)``.

    ``top``/``low`` are the max/min logits, ``hinge = sum_j ReLU(g_j)`` and
    ``neg = sum_j ReLU(g_j)^2`` with ``g_j = top - z_j - margin`` (the
    ``j = argmax`` term is ``ReLU(-M)^2 = 0``, so summing over all ``j`` is
    exact), then the first arg-max, the first arg-min and the number of active
    hinges (int32). Three fused passes over ``[B, K]``; the derivative is
    stated in the rule below (``top``/``low`` move with the first
    arg-max/arg-min), so the backward pass is a single elementwise pass.

    Kernel family ``'loss_acls'`` (:mod:`calib_jax.kernels`): the plain
    formulation is :func:`_acls_parts_plain`; float64 reference in
    ``tests/_reference.py``.
    """
    k = z.shape[1]
    top, low = _row_reduce((z, z), (-jnp.inf, jnp.inf), (lax.max, lax.min))
    gap = top[:, None] - z - margin
    active = gap > 0
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    # One float sum per reduction (see _row_reduce), grouped so that under
    # value_and_grad every reduction keeps at least two used outputs (count
    # only feeds the derivative of hinge, which a first-order gradient drops).
    hinge, first_max, count = _row_reduce(
        (
            jnp.where(active, gap, 0.0),
            jnp.where(z == top[:, None], cols, k),
            active.astype(jnp.int32),
        ),
        (0, k, 0),
        (lax.add, lax.min, lax.add),
    )
    neg, first_min = _row_reduce(
        (jnp.where(active, gap * gap, 0.0), jnp.where(z == low[:, None], cols, k)),
        (0, k),
        (lax.add, lax.min),
    )
    return top, low, hinge, neg, first_max, first_min, count


def _acls_parts_plain(z, margin):
    """Plain :func:`_acls_parts`: ``argmax``/``argmin`` and ReLU sums, autodiff."""
    top, first_max = _first_max(z)
    first_min = jnp.argmin(z, axis=1).astype(jnp.int32)
    low = _take_col(z, first_min)
    gap = top[:, None] - z - margin
    active = gap > 0
    relu_gap = jnp.where(active, gap, 0.0)
    hinge = jnp.sum(relu_gap, axis=1)
    neg = jnp.sum(relu_gap * relu_gap, axis=1)
    count = jnp.sum(active.astype(jnp.int32), axis=1)
    return top, low, hinge, neg, first_max, first_min, count


@_acls_parts.defjvp
def _acls_parts_jvp(primals, tangents):
    z, margin = primals
    dz, dmargin = tangents
    out = _acls_parts(z, margin)
    top, _, hinge, _, first_max, first_min, count = out
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    gap = top[:, None] - z - margin
    active = lax.stop_gradient(gap) > 0
    relu_gap = jnp.where(active, gap, 0.0)
    dtop = jnp.sum(jnp.where(cols == first_max[:, None], dz, 0.0), axis=1)
    dlow = jnp.sum(jnp.where(cols == first_min[:, None], dz, 0.0), axis=1)
    dshift = dtop - dmargin  # d(top - margin)
    dhinge = count.astype(z.dtype) * dshift - jnp.sum(
        jnp.where(active, dz, 0.0), axis=1
    )
    # d sum_j ReLU(g_j)^2 = 2 hinge d(top - M) - 2 sum_j ReLU(g_j) dz_j.
    dneg = 2.0 * hinge * dshift - 2.0 * jnp.sum(relu_gap * dz, axis=1)
    int_tangents = tuple(_no_tangent(v) for v in (first_max, first_min, count))
    return out, (dtop, dlow, dhinge, dneg, *int_tangents)


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

    This is the smoothing function Eq. (10) times the indicator Eq. (11).
    It equals :math:`\tfrac12` of the gradient of the Eq. (13) regularizer
    with ``stop_gradient`` on :math:`\min_k z_k` (first term) and on
    :math:`z_{\hat y}` (second term), **not** the gradient of :func:`acls`
    (see there for the exact difference). Useful to train with the paper's
    stated gradient (e.g. through a custom VJP) or to inspect it.

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
      [1] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      Eqs. (10)-(12).

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
    _check_num_classes(logits)
    return _acls_logit_grad(logits, labels, mask, margin, lambda_1, lambda_2)


@jax.jit
def _acls_logit_grad(logits, labels, mask, margin, lambda_1, lambda_2):
    logits, _ = _clean(logits, labels, mask)
    dtype = logits.dtype
    margin = jnp.asarray(margin, dtype)
    top = jnp.max(logits, axis=1)
    pred = _first_index(logits, top)
    low = jnp.min(logits, axis=1, keepdims=True)
    top = top[:, None]
    is_pred = lax.broadcasted_iota(jnp.int32, logits.shape, 1) == pred[:, None]
    pos = jnp.asarray(lambda_1, dtype) * jax.nn.relu(logits - low - margin)
    neg = -jnp.asarray(lambda_2, dtype) * jax.nn.relu(top - logits - margin)
    grad = jnp.where(is_pred, pos, neg)
    return jnp.where(mask[:, None], grad, jnp.zeros_like(grad))


# ---------------------------------------------------------------------------
# CPC.
# ---------------------------------------------------------------------------


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

    :math:`\mathcal{L}_{1v1}` is the binary cross-entropy of the true class
    against each other class; :math:`\mathcal{L}_{BE}` pushes every pair of
    non-true classes towards equal probability. The double sum runs over
    **ordered** pairs (each unordered pair counts twice), which is the reading
    under which the gradient [2] derives, Eq. (6),
    :math:`\partial\mathcal{L}_{BE}/\partial z_j = 2\sum_{k \ne y}
    \frac{p_j - p_k}{p_j + p_k}`, holds; the :math:`k = l` terms (a constant
    :math:`2\log 2` each) are left out. Both are **sums**, not means:
    averaging over the :math:`K - 1` pairs of :math:`\mathcal{L}_{1v1}` or the
    :math:`(K - 1)(K - 2)` ordered pairs of :math:`\mathcal{L}_{BE}` is the
    same as dividing :math:`\lambda_1`, :math:`\lambda_2` by those counts.

    Source: the exact form (terms, pair set, sums) is that of [2],
    Eqs. (2)-(4); it has not been checked against the text of [1]. Neither
    [2] nor the other papers cited here state CPC's
    :math:`\lambda_1, \lambda_2`; the defaults
    1.0 and 1.0 are neutral placeholders, **not paper values**. With the
    summed form :math:`\mathcal{L}_{BE}` grows like :math:`K^2`; tune
    :math:`\lambda_2` accordingly. The primary cross-entropy of [2], Eq. (2),
    is not included.

    Cost: :math:`\mathcal{L}_{BE}` is :math:`O(K^2)` per example by
    definition. It is evaluated in class blocks (at most
    :math:`2^{22}` pair terms in memory at a time, recomputed in the backward
    pass), so memory stays :math:`O(BK)`, but time is quadratic in :math:`K`:
    at :math:`(B, K) = (4096, 1000)` forward plus backward costs about
    :math:`10^4` times cross-entropy on a CPU (about :math:`2\times 10^3`
    times at :math:`K = 100`).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      lambda_1: weight of :math:`\mathcal{L}_{1v1}`, :math:`\ge 0`.
      lambda_2: weight of :math:`\mathcal{L}_{BE}`, :math:`\ge 0`.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), the penalty only, unreduced.

    References:
      [1] J. Cheng, N. Vasconcelos, "Calibrating Deep Neural Networks by
      Pairwise Constraints", CVPR 2022.
      [2] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      supplementary Sec. S1.2, Eqs. (2)-(8).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
      >>> print(cpc(logits, jnp.array([0, 0])))  # 6 log 2; 2 softplus(-3) + 4 log 2
      [4.158883  2.8697634]
    """
    check_nonnegative("lambda_1", lambda_1)
    check_nonnegative("lambda_2", lambda_2)
    logits, labels, mask = prepare(logits, labels, where)
    _check_num_classes(logits)
    b, k = logits.shape
    block = max(1, min(k, _PAIR_BLOCK_ELEMENTS // max(b * k, 1)))
    return _cpc(logits, labels, mask, lambda_1, lambda_2, block=block)


@functools.partial(jax.jit, static_argnames="block")
def _cpc(logits, labels, mask, lambda_1, lambda_2, *, block):
    logits, labels = _clean(logits, labels, mask)
    dtype = logits.dtype
    cols = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    rest = cols != labels[:, None]
    z_true = _take_col(logits, labels)
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
    """``sum_{k != l, rest[k], rest[l]} softplus(z_k - z_l)`` per row, ``[B]``.

    Scans over blocks of ``block`` classes; each step builds a ``[B, block, K]``
    slab. The body is rematerialised in the backward pass, so no slab is kept.
    """
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
