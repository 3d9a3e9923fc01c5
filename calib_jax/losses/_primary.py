r"""Primary per-example losses: cross-entropy, label smoothing and the Brier score.

Also holds :func:`_true_vs_rest`, the true-class-versus-the-rest decomposition of
the softmax that the focal family shares. Writing
:math:`d = z_y - \log\sum_{k \ne y} e^{z_k}` gives

.. math::

    \log p_y = \log\sigma(d), \qquad \log(1 - p_y) = \log\sigma(-d),

both finite with finite gradients for every finite logit vector (:math:`K \ge 2`),
including :math:`p_y` that rounds to 0 or 1. Computing :math:`1 - p_y` as
``1 - exp(log p_y)`` instead loses it to rounding once :math:`p_y > 1 - 10^{-7}`,
and :math:`(1 - p_y)^\gamma` then has a NaN gradient.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.losses._common import (
    _row_reduce,
    _unfused,
    check_unit_interval,
    prepare,
    zero_masked,
)

_OFF_TARGET = ("uniform", "others")


def _check_num_classes(logits: jax.Array) -> None:
    """Static check: the losses of this package need at least two classes."""
    if logits.shape[1] < 2:
        raise ValueError(
            f"logits must have at least 2 classes, got shape {logits.shape}."
        )


def _clean(logits: jax.Array, labels: jax.Array, mask: jax.Array):
    """Zeroes excluded rows (and their labels) so NaN/inf cannot leak.

    ``jnp.where`` (not a product): the cotangent of an excluded row is then
    exactly 0, whatever it held.
    """
    logits = jnp.where(mask[:, None], logits, jnp.zeros_like(logits))
    labels = jnp.where(mask, labels, jnp.zeros_like(labels))
    return logits, labels


def _take_col(x: jax.Array, idx: jax.Array) -> jax.Array:
    """``x[b, idx[b]]`` as ``[B]``; the gradient goes to that one entry."""
    return jnp.take_along_axis(x, idx[:, None], axis=1)[:, 0]


def _first_index(x: jax.Array, value: jax.Array) -> jax.Array:
    """First column ``k`` with ``x[b, k] == value[b]``, int32 ``[B]``.

    ``value`` must be attained in every row (a row max or min). A ``where``
    plus an integer min over the classes; on XLA:CPU about 4x faster than
    ``jnp.argmax`` at (4096, 1000).
    """
    cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    first = jnp.min(jnp.where(x == value[:, None], cols, x.shape[1]), axis=1)
    return lax.stop_gradient(first)


def _row_max(x: jax.Array) -> jax.Array:
    """Row max ``[B]`` whose gradient goes to the first arg-max only.

    Same value as ``jnp.max``; on ties the derivative is that of the first
    maximal entry (a one-sided derivative, as with ``argmax``-based code),
    instead of ``jnp.max``'s equal split, which on XLA:CPU materialises several
    ``[B, K]`` temporaries.
    """
    top = lax.stop_gradient(jnp.max(x, axis=1))
    return _take_col(x, _first_index(lax.stop_gradient(x), top))


def _row_min(x: jax.Array) -> jax.Array:
    """Row min ``[B]`` whose gradient goes to the first arg-min only."""
    low = lax.stop_gradient(jnp.min(x, axis=1))
    return _take_col(x, _first_index(lax.stop_gradient(x), low))


class _Split(NamedTuple):
    """Per-row true-class-versus-rest statistics, each ``[B]``."""

    z_true: jax.Array  # z_y
    z_rest_max: jax.Array  # max_{k != y} z_k, a constant (no gradient)
    rest_sum: jax.Array  # sum_{k != y} exp(z_k - z_rest_max), >= 1
    rest_sq_sum: jax.Array | None  # sum_{k != y} exp(z_k - z_rest_max)^2, >= 1

    @property
    def d(self) -> jax.Array:
        """Log-odds of the true class against all the others."""
        # The shift is a constant: log-sum-exp is shift invariant.
        lse_rest = lax.stop_gradient(self.z_rest_max) + jnp.log(self.rest_sum)
        return self.z_true - lse_rest

    @property
    def log_p_true(self) -> jax.Array:
        return jax.nn.log_sigmoid(self.d)

    @property
    def log_1m_p_true(self) -> jax.Array:
        return jax.nn.log_sigmoid(-self.d)

    @property
    def log_sq_ratio(self) -> jax.Array:
        """``log(sum_{k != y} e_k^2 / (sum_{k != y} e_k)^2)``."""
        return jnp.log(self.rest_sq_sum) - 2.0 * jnp.log(self.rest_sum)


def _true_vs_rest(
    logits: jax.Array, labels: jax.Array, *, squares: bool = False
) -> _Split:
    r"""True-class-versus-rest statistics at about the cost of a log-sum-exp.

    Two max passes and one exponential pass over ``[B, K]`` (plus a sum of
    squares for ``squares``), and no comparison of the class index with the
    label (costly on XLA:CPU). The exponentials are written once and reused by
    the gradient. The shift is the largest non-true logit
    :math:`r = \max_{k \ne y} z_k`: the row max :math:`m`, or, when :math:`y`
    is the unique maximum, the largest logit below it (both from a float
    compare with :math:`m`). With :math:`c_k =
    e^{\min(z_k - r,\, 0)}` (the clamp changes only :math:`c_y`, the one entry
    that can exceed :math:`r`),

    .. math::

        \sum_{k \ne y} e^{z_k - r} = \sum_k c_k - c_y \ge 1,

    a sum that holds :math:`e^0 = 1` minus a term :math:`c_y \le 1`, so the
    subtraction loses at most a few ulps however close :math:`p_y` is to 0 or
    1, and nothing overflows or underflows to 0.

    The derivative is a ``custom_jvp`` rule (all orders): :math:`r` is a
    constant (log-sum-exp is shift invariant) and the sums move with
    :math:`\sum_k c_k\,dz_k - c_y\,dz_y` (and twice that with :math:`c^2`).
    Its transpose, the gradient, is one elementwise ``[B, K]`` pass plus an
    in-place scatter of the label term (a gather in the rule), as for
    cross-entropy.

    Kernel family ``'loss_true_vs_rest'`` (:mod:`calib_jax.kernels`): the
    plain formulation is :func:`_rest_parts_plain`; float64 references in
    ``tests/_reference.py``.
    """
    parts = kernels.select(
        "loss_true_vs_rest",
        lambda z, y: _rest_parts(z, y, squares),
        functools.partial(_rest_parts_plain, squares=squares),
        logits,
        labels,
    )
    return _Split(*parts)


def _rest_parts_plain(z, labels, *, squares):
    """Plain :func:`_rest_parts`: a masked log-sum-exp with JAX autodiff."""
    z_true = _take_col(z, labels)
    cols = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    rest = jnp.where(cols == labels[:, None], -jnp.inf, z)
    # The shift is a constant (log-sum-exp is shift invariant).
    rest_max = lax.stop_gradient(jnp.max(rest, axis=1))
    e = jnp.exp(rest - rest_max[:, None])
    rest_sq = jnp.sum(e * e, axis=1) if squares else None
    return z_true, rest_max, jnp.sum(e, axis=1), rest_sq


def _clamped_exp(s: jax.Array) -> jax.Array:
    """``exp(min(s, 0))`` whose derivative at ``s == 0`` is that of ``exp``."""
    return jnp.exp(jnp.where(s > 0, jnp.zeros_like(s), s))


def _rest_max(z: jax.Array, z_true: jax.Array) -> jax.Array:
    """``max_{k != y} z_k`` per row, ``[B]``, without a compare with the label.

    The row max, or the largest logit below it when the label is the unique
    maximum: a library max pass plus one fused loop for the largest logit
    below the max and the number of maxima (a finite sentinel: an infinite one
    makes XLA:CPU emit a scalar loop). No derivative is taken through it.
    """
    finfo = jnp.finfo(z.dtype)
    # The row max is its own reduction (see _common._unfused).
    m = _unfused(jnp.max(z, axis=1))
    below = z < m[:, None]
    second, n_top = _row_reduce(
        (jnp.where(below, z, finfo.min), jnp.where(below, 0, 1).astype(jnp.int32)),
        (finfo.min, 0),
        (lax.max, lax.add),
    )
    return jnp.where((z_true >= m) & (n_top == 1), second, m)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _rest_parts(z, labels, squares):
    """``(z_true, z_rest_max, rest_sum, rest_sq_sum or None)``; see
    :func:`_true_vs_rest`."""
    z_true = _take_col(z, labels)
    rest_max = _rest_max(z, z_true)
    # The same expressions as in the rule below, so that XLA computes the
    # exponentials once, writes them out and reuses them for the gradient (as
    # it does for cross-entropy's softmax).
    c = _clamped_exp(z - rest_max[:, None])
    c_true = _clamped_exp(z_true - rest_max)
    rest_sq = None
    if squares:
        # Squares of the stored exponentials: the barrier (no value change)
        # stops XLA:CPU from recomputing them as exp(2 s); the two-output
        # reduction sums them in one read of c, without writing c * c out.
        c = lax.optimization_barrier(c)
        sq, n_ge = _row_reduce(
            (c * c, jnp.where(c < 1.0, 0, 1).astype(jnp.int32)),
            (0, 0),
            (lax.add, lax.add),
        )
        # n_ge >= 1 (the largest other logit gives c = e^0 = 1), so this
        # select changes no value; using n_ge keeps the reduction two-output.
        sq = jnp.where(n_ge > 0, sq, jnp.full_like(sq, jnp.nan))
        rest_sq = sq - c_true * c_true
    rest = jnp.sum(c, axis=1) - c_true
    return z_true, rest_max, rest, rest_sq


@_rest_parts.defjvp
def _rest_parts_jvp(squares, primals, tangents):
    z, labels = primals
    dz, _ = tangents
    out = _rest_parts(z, labels, squares)
    z_true, rest_max = out[0], lax.stop_gradient(out[1])
    c = _clamped_exp(z - rest_max[:, None])
    c_true = _clamped_exp(z_true - rest_max)
    dz_true = _take_col(dz, labels)
    drest = jnp.sum(c * dz, axis=1) - c_true * dz_true
    drest_sq = None
    if squares:
        c = lax.optimization_barrier(c)  # as in the primal: c * c, not exp(2 s)
        drest_sq = 2.0 * (jnp.sum(c * c * dz, axis=1) - c_true * c_true * dz_true)
    return out, (dz_true, jnp.zeros_like(rest_max), drest, drest_sq)


# ---------------------------------------------------------------------------
# Cross-entropy.
# ---------------------------------------------------------------------------


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

    Computed as log-sum-exp minus the label logit (one max and one exp pass
    over the classes), never as ``log(softmax)``.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023, Eq. (1)
      with one-hot :math:`q` and Eq. (2).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
      >>> print(cross_entropy(logits, jnp.array([0, 2])))
      [0.16984606 1.0986123 ]
    """
    logits, labels, mask = prepare(logits, labels, where)
    _check_num_classes(logits)
    return _cross_entropy(logits, labels, mask)


@jax.jit
def _cross_entropy(logits, labels, mask):
    logits, labels = _clean(logits, labels, mask)
    loss = jax.nn.logsumexp(logits, axis=1) - _take_col(logits, labels)
    return zero_masked(loss, mask)


# ---------------------------------------------------------------------------
# Label smoothing.
# ---------------------------------------------------------------------------


def label_smoothing(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    epsilon: jax.typing.ArrayLike = 0.1,
    off_target: str = "uniform",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Cross-entropy against label-smoothed targets, per-example.

    With ``off_target='uniform'`` (the default) this is the standard label
    smoothing of Szegedy et al. [2] as analysed by Müller et al. [3] and
    restated by the ACLS paper [1], Eq. (4): the one-hot target is mixed with
    the uniform distribution over **all** :math:`K` classes,

    .. math::

        q_k = (1 - \epsilon)\,[k = y] + \frac{\epsilon}{K},
        \qquad
        \ell_{\mathrm{LS}}(z, y) = -\sum_{k=1}^{K} q_k \log p_k,

    so the true class gets :math:`1 - \epsilon(1 - 1/K)` and every other class
    :math:`\epsilon/K` ([1], Eq. (4) and the gradient of Eq. (5)). This is the
    baseline the ACLS and MbLS papers compare against.

    ``off_target='others'`` spreads the mass over the :math:`K - 1` non-target
    classes only: :math:`q_y = 1 - \epsilon`,
    :math:`q_k = \epsilon / (K - 1)` for :math:`k \ne y`. The two conventions
    differ in value by :math:`\epsilon\,[\frac{1}{K}\sum_k (-\log p_k) -
    \frac{1}{K-1}\sum_{k \ne y} (-\log p_k)]`; ``uniform`` with
    :math:`\epsilon` equals ``others`` with :math:`\epsilon (K - 1)/K`.

    Computed as :math:`\log\sum_k e^{z_k} - \sum_k q_k z_k` (no
    ``log(softmax)`` array). With :math:`\epsilon = 0` it is
    :func:`cross_entropy`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      epsilon: smoothing mass :math:`\epsilon \in [0, 1]`; default 0.1, the
        value of [2] (Sec. 7) and [3].
      off_target: static str, ``'uniform'`` (all :math:`K` classes, [1]-[3])
        or ``'others'`` (the :math:`K - 1` non-target classes).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Park, J. Noh, Y. Oh, D. Baek, B. Ham, "ACLS: Adaptive and
      Conditional Label Smoothing for Network Calibration", ICCV 2023,
      Eqs. (4)-(5).
      [2] C. Szegedy, V. Vanhoucke, S. Ioffe, J. Shlens, Z. Wojna, "Rethinking
      the Inception Architecture for Computer Vision", CVPR 2016, Sec. 7.
      [3] R. Müller, S. Kornblith, G. Hinton, "When Does Label Smoothing
      Help?", NeurIPS 2019.

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
    _check_num_classes(logits)
    return _label_smoothing(logits, labels, mask, epsilon, off_target=off_target)


@functools.partial(jax.jit, static_argnames="off_target")
def _label_smoothing(logits, labels, mask, epsilon, *, off_target):
    logits, labels = _clean(logits, labels, mask)
    k = logits.shape[1]
    eps = jnp.asarray(epsilon, logits.dtype)
    z_true = _take_col(logits, labels)
    total = jnp.sum(logits, axis=1)
    if off_target == "uniform":
        off = total / k
    else:
        off = (total - z_true) / (k - 1)
    # -sum_k q_k log p_k = lse - sum_k q_k z_k, since sum_k q_k = 1.
    loss = jax.nn.logsumexp(logits, axis=1) - (1.0 - eps) * z_true - eps * off
    return zero_masked(loss, mask)


# ---------------------------------------------------------------------------
# Brier score.
# ---------------------------------------------------------------------------


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
    (Brier [2]; [1], Def. A.2, Eq. (19), per sample). It lies in
    :math:`[0, 2]`. Some papers and libraries divide by :math:`K` (a mean over
    classes); this function does **not**.

    Computed as :math:`(1 - p_y)^2\,(1 + \sum_{k \ne y} e_k^2 /
    (\sum_{k \ne y} e_k)^2)` with :math:`e_k = e^{z_k - \max_{k' \ne y}
    z_{k'}}` and :math:`1 - p_y` from the true-class-versus-rest log-odds, so
    nothing cancels when :math:`p_y \to 1`.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities, :math:`K \ge 2`.
      labels: int ``[B]`` class ids in ``[0, K)``.
      where: optional bool ``[B]``; ``False`` rows are ignored (padding) and
        get the value 0.

    Returns:
      float32 ``[B]`` (float64 for float64 logits), unreduced.

    References:
      [1] H. Zhou, S. G. Gruber, T. Popordanoska, M. B. Blaschko, "Revisiting
      Reweighted Risk for Calibration: AURC, Focal and Inverse Focal Loss",
      2025, Def. A.2, Eq. (19).
      [2] G. W. Brier, "Verification of Forecasts Expressed in Terms of
      Probability", Monthly Weather Review 78(1), 1950.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[0.0, 0.0], [2.0, 0.0]])
      >>> print(brier(logits, jnp.array([0, 0])))
      [0.5        0.02841867]
    """
    logits, labels, mask = prepare(logits, labels, where)
    _check_num_classes(logits)
    return _brier(logits, labels, mask)


@jax.jit
def _brier(logits, labels, mask):
    logits, labels = _clean(logits, labels, mask)
    split = _true_vs_rest(logits, labels, squares=True)
    # p_k / (1 - p_y) = e_k / sum_{k' != y} e_k' for every k != y.
    loss = jnp.exp(2.0 * split.log_1m_p_true) * (1.0 + jnp.exp(split.log_sq_ratio))
    return zero_masked(loss, mask)
