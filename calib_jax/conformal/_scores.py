r"""Conformity scores and prediction sets of THR (LAC), APS and RAPS, and the
split-conformal quantile.

All functions take probabilities ``[N, K]`` (rows on the simplex; use
``jax.nn.softmax`` on logits, after any calibrator), compute in float32 (bf16
and fp16 are upcast) and are pure and jittable; they vmap over splits.

Conventions shared by APS and RAPS (written out in ``docs/conformal.md``):

- *Ranking.* Classes are ranked by decreasing probability; ties are broken by
  the lower class index first (the ``jnp.argmax`` rule), so the rank
  :math:`o_x(y) \in \{1, \dots, K\}` and the mass ranked before
  :math:`y`, :math:`\rho_x(y)`, are defined for every class. With distinct
  probabilities they equal the papers' :math:`o_x(y) = |\{y' :
  \hat\pi_x(y') \ge \hat\pi_x(y)\}|` and :math:`\rho_x(y) = \sum_{y'}
  \hat\pi_x(y') 1[\hat\pi_x(y') > \hat\pi_x(y)]`.
- *Score.* :math:`E(x, y, u) = \rho_x(y) + u\,\hat\pi_x(y) + \lambda\,(o_x(y)
  - k_{reg})^+`, with :math:`\lambda = 0` for APS. Randomised: one
  :math:`u \sim U[0, 1)` per row, shared by the row's classes (as in the
  papers' randomised sets, not one draw per class). Non-randomised:
  :math:`u = 1` in calibration *and* prediction, i.e. the probability mass up
  to and including :math:`y`; the same score on both sides keeps the upper
  bound of the coverage guarantee.
- *Sets.* :math:`C(x) = \{y : E(x, y, u) \le \hat q\}`. The score is
  non-decreasing along the ranking, so a set is the top-:math:`L` classes.
  Scores are computed on the sorted probabilities (one sort per row, a
  cumulative sum and, to remove rounding-level decreases, a running maximum
  along the ranking); the score of a labelled class is read from the same
  array, so ``label in set`` holds exactly when ``score <= qhat``. Sets may be
  empty (e.g. randomised sets with a small :math:`u`, or non-randomised sets
  of a very confident row); see ``allow_empty`` in :func:`calib_jax.conformal.fit`.

References:
  [1] M. Sadinle, J. Lei and L. Wasserman, "Least Ambiguous Set-Valued
  Classifiers with Bounded Error Levels", JASA 114(525), 2019,
  arXiv:1609.00451v2, Sec. 2 (the oracle set :math:`\{y : p(y|x) \ge t\}`)
  and Sec. 4 (its plug-in, split estimate).
  [2] Y. Romano, M. Sesia and E. J. Candès, "Classification with Valid and
  Adaptive Coverage", NeurIPS 2020, arXiv:2006.02544v1: the randomised
  generalised-quantile sets of the oracle (Sec. 1.1, Eqs. (5)-(6)), the
  generalised inverse quantile conformity score (Sec. 2.1, Eq. (7)) and its
  split-conformal calibration (Sec. 2.2, Algorithm 1).
  [3] A. N. Angelopoulos, S. Bates, J. Malik and M. I. Jordan, "Uncertainty
  Sets for Image Classifiers using Conformal Prediction", ICLR 2021,
  arXiv:2009.14193v5, Sec. 2 (RAPS, Algorithms 1 and 2).
  [4] J. Lei, M. G'Sell, A. Rinaldo, R. J. Tibshirani and L. Wasserman,
  "Distribution-Free Predictive Inference for Regression", JASA 113(523),
  2018, arXiv:1604.04173v2, Sec. 2.2 and Thm. 2.2 (split conformal); V. Vovk,
  A. Gammerman and G. Shafer, "Algorithmic Learning in a Random World",
  Springer 2005.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks, kernels
from calib_jax.conformal import _by_reduction, _cpu_kernels


def _as_float(x, name: str) -> jax.Array:
    x = _checks.check_floating(x, name)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _check_probs(probs) -> jax.Array:
    probs = _as_float(probs, "probs")
    _checks.check_rank(probs, "probs", "[N, K]")
    return probs


def check_labels(labels, n: int, k: int, where=None) -> jax.Array:
    """Int ``[n]`` class ids in ``[0, k)`` as a JAX array.

    The range is checked on the host before conversion (NumPy int64 labels
    outside the int32 range) and, for concrete inputs, on the values; a
    gather at an out-of-range label would clamp it to a valid class.

    Raises:
      TypeError: non-integer labels.
      ValueError: another shape, or a (concrete) label of an included row
        outside ``[0, k)``.
    """
    if not isinstance(labels, (jax.Array, jax.core.Tracer)):
        labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        labels = _checks.check_labels_dtype(labels)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape [N] = ({n},), got {labels.shape}.")
    labels = jnp.asarray(_checks.check_host_labels(labels, k, where))
    _checks.check_label_values(labels, k, where)
    return labels


def _check_u(u, n: int, dtype) -> jax.Array | None:
    if u is None:
        return None
    u = _as_float(u, "u")
    if u.shape != (n,):
        raise ValueError(f"u must have shape [N] = ({n},), got {u.shape}.")
    return u.astype(dtype)


def check_k_reg(k_reg) -> int:
    """RAPS's ``k_reg`` as int; TypeError for a non-int, ValueError below 0."""
    return _checks.check_int("k_reg", k_reg, minimum=0)


# ---------------------------------------------------------------------------
# THR (LAC)
# ---------------------------------------------------------------------------


def thr_score(probs: jax.typing.ArrayLike, labels: jax.typing.ArrayLike) -> jax.Array:
    r"""THR/LAC conformity score of the labelled class, per example.

    .. math::  s(x, y) = 1 - \hat\pi_x(y)

    the score whose split-conformal quantile gives the least ambiguous sets
    of [1] (the thresholded class probabilities, Sec. 2 and 4 of [1]).

    Args:
      probs: float ``[N, K]`` class probabilities.
      labels: int ``[N]`` class ids in ``[0, K)``.

    Returns:
      float32 ``[N]`` scores in ``[0, 1]``.

    References:
      [1] M. Sadinle, J. Lei and L. Wasserman, "Least Ambiguous Set-Valued
      Classifiers with Bounded Error Levels", JASA 2019, arXiv:1609.00451v2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> p = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
      >>> print(conformal.thr_score(p, jnp.array([0, 1])))
      [0.3 0.7]
    """
    probs = _check_probs(probs)
    labels = check_labels(labels, *probs.shape)
    return 1.0 - jnp.take_along_axis(probs, labels[:, None], axis=1)[:, 0]


def thr_sets(probs: jax.typing.ArrayLike, qhat: jax.typing.ArrayLike) -> jax.Array:
    r"""THR/LAC prediction sets :math:`\{y : 1 - \hat\pi_x(y) \le \hat q\}`.

    Every class whose probability is at least :math:`1 - \hat q`; a row whose
    largest probability is below it gets the empty set (allowed, as in [1]).

    Args:
      probs: float ``[N, K]`` class probabilities.
      qhat: scalar threshold (from :func:`conformal_quantile` of
        :func:`thr_score` on calibration data).

    Returns:
      bool ``[N, K]``; ``True`` marks the classes in the set.

    References:
      [1] M. Sadinle, J. Lei and L. Wasserman, JASA 2019, arXiv:1609.00451v2.
    """
    probs = _check_probs(probs)
    return (1.0 - probs) <= jnp.asarray(qhat, probs.dtype)


# ---------------------------------------------------------------------------
# APS and RAPS
# ---------------------------------------------------------------------------


@kernels.dispatch("conformal_row_sort", _cpu_kernels.sort_desc)
def sort_desc(probs):
    """Each row of ``probs`` in decreasing order (the ranking of APS/RAPS)."""
    return -jnp.sort(-probs, axis=-1)


def sorted_scores(probs, u, lam, k_reg: int):
    """Descending probabilities and the non-decreasing scores along them.

    Returns ``(desc [N, K], scores [N, K])``: ``scores[:, j]`` is the score
    of the class ranked ``j`` (0-based).
    """
    desc = sort_desc(probs)
    cum = jnp.cumsum(desc, axis=-1)
    before = jnp.concatenate([jnp.zeros_like(cum[:, :1]), cum[:, :-1]], axis=-1)
    weight = desc if u is None else u[:, None] * desc
    k = probs.shape[-1]
    rank = lax.iota(jnp.int32, k) + 1
    excess = jnp.maximum(rank - k_reg, 0).astype(probs.dtype)
    raw = before + weight + jnp.asarray(lam, probs.dtype) * excess[None, :]
    # The exact score never decreases along the ranking; the running maximum
    # removes float rounding decreases so that sets are prefixes exactly.
    return desc, lax.cummax(raw, axis=1)


def _label_positions(probs, labels):
    """0-based rank of each labelled class (ties: lower index first)."""
    k = probs.shape[-1]
    p_y = jnp.take_along_axis(probs, labels[:, None], axis=1)
    idx = lax.iota(jnp.int32, k)[None, :]
    ahead = (probs > p_y) | ((probs == p_y) & (idx < labels[:, None]))
    return jnp.sum(ahead.astype(jnp.int32), axis=1)


def _prefix_sets(probs, desc, scores, qhat):
    """Class-order membership of the top-``L`` classes, ``L = #{scores <= q}``.

    Without a scatter: with ``v`` the ``L``-th largest probability, a class is
    in the set when its probability exceeds ``v``, or equals it and it is
    among the first ``L - #{p > v}`` classes of value ``v`` in index order.
    """
    k = probs.shape[-1]
    size = jnp.sum((scores <= qhat).astype(jnp.int32), axis=1)  # [N]
    last = jnp.clip(size - 1, 0, k - 1)
    v = jnp.take_along_axis(desc, last[:, None], axis=1)  # [N, 1]
    above = probs > v
    tied = probs == v
    slots = size - jnp.sum(above.astype(jnp.int32), axis=1)  # [N]
    tied_i = tied.astype(jnp.int32)
    tie_order = jnp.cumsum(tied_i, axis=1) - tied_i
    member = above | (tied & (tie_order < slots[:, None]))
    return member & (size > 0)[:, None]


def raps_score(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    u: jax.typing.ArrayLike | None = None,
    lam: jax.typing.ArrayLike = 0.1,
    k_reg: int = 1,
    class_sharded: bool = False,
) -> jax.Array:
    r"""RAPS conformity score of the labelled class, per example.

    .. math::

        E(x, y, u) = \rho_x(y) + u\,\hat\pi_x(y)
                     + \lambda\,\bigl(o_x(y) - k_{reg}\bigr)^+

    with :math:`\rho_x(y)` the probability mass ranked before :math:`y` and
    :math:`o_x(y)` its 1-based rank (Sec. 2 of [1]; ties broken by class
    index, see the module docstring). ``lam = 0`` gives APS
    (:func:`aps_score`).

    Args:
      probs: float ``[N, K]`` class probabilities.
      labels: int ``[N]`` class ids in ``[0, K)``.
      u: optional float ``[N]`` uniforms in ``[0, 1]``, one per row
        (randomised score); ``None`` means :math:`u = 1` (non-randomised).
      lam: penalty :math:`\lambda \ge 0` per rank beyond ``k_reg`` (traceable).
      k_reg: static int :math:`k_{reg} \ge 0`, the number of top ranks
        without penalty.
      class_sharded: static; True computes the score by row reductions
        (``_by_reduction.raps_score``), the form for a class axis sharded
        over devices: no sort, no gather of ``[N, K]``; equal to the sorted
        form to float32 rounding (about 1e-7 relative).

    Returns:
      float32 ``[N]`` scores; equal to the entry of the row's sorted score
      array that :func:`raps_sets` thresholds (``class_sharded=False``).

    References:
      [1] A. N. Angelopoulos, S. Bates, J. Malik and M. I. Jordan, ICLR 2021,
      arXiv:2009.14193v5, Sec. 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> p = jnp.array([[0.5, 0.3, 0.2]])
      >>> print(conformal.raps_score(p, jnp.array([2]), lam=0.1, k_reg=1))
      [1.2]
    """
    probs = _check_probs(probs)
    n = probs.shape[0]
    labels = check_labels(labels, n, probs.shape[1])
    u = _check_u(u, n, probs.dtype)
    k_reg = check_k_reg(k_reg)
    if _checks.check_bool("class_sharded", class_sharded):
        return _by_reduction.raps_score(probs, labels, u, lam, k_reg=k_reg)
    return raps_score_core(probs, labels, u, lam, k_reg=k_reg)


@functools.partial(jax.jit, static_argnames="k_reg")
def raps_score_core(probs, labels, u, lam, *, k_reg):
    """:func:`raps_score` on checked inputs (jitted, no checks)."""
    _, scores = sorted_scores(probs, u, lam, k_reg)
    pos = _label_positions(probs, labels)
    return jnp.take_along_axis(scores, pos[:, None], axis=1)[:, 0]


def raps_sets(
    probs: jax.typing.ArrayLike,
    qhat: jax.typing.ArrayLike,
    *,
    u: jax.typing.ArrayLike | None = None,
    lam: jax.typing.ArrayLike = 0.1,
    k_reg: int = 1,
    class_sharded: bool = False,
) -> jax.Array:
    r"""RAPS prediction sets :math:`\{y : E(x, y, u) \le \hat q\}`.

    The top-:math:`L` classes of each row, :math:`L` the number of ranks whose
    score (:func:`raps_score`) is at most :math:`\hat q`; :math:`L = 0` gives
    the empty set. The prediction of Algorithm 2 of [1] with one :math:`u`
    per row.

    Args:
      probs: float ``[N, K]`` class probabilities.
      qhat: scalar threshold (the conformal quantile of calibration scores
        computed with the same ``lam``, ``k_reg`` and randomisation).
      u: optional float ``[N]`` uniforms (randomised sets); ``None`` means
        :math:`u = 1`.
      lam: penalty :math:`\lambda \ge 0` (traceable).
      k_reg: static int :math:`k_{reg} \ge 0`.
      class_sharded: static; True: the sets of the reduction-form scores
        (``_by_reduction.raps_sets``, bisection by row reductions, no
        sort or gather of ``[N, K]``), to pair with ``raps_score(...,
        class_sharded=True)``.

    Returns:
      bool ``[N, K]`` in class order.

    References:
      [1] A. N. Angelopoulos et al., ICLR 2021, arXiv:2009.14193v5, Sec. 2.
    """
    probs = _check_probs(probs)
    u = _check_u(u, probs.shape[0], probs.dtype)
    k_reg = check_k_reg(k_reg)
    if _checks.check_bool("class_sharded", class_sharded):
        return _by_reduction.raps_sets(probs, jnp.asarray(qhat), u, lam, k_reg=k_reg)
    return raps_sets_core(probs, jnp.asarray(qhat), u, lam, k_reg=k_reg)


@functools.partial(jax.jit, static_argnames="k_reg")
def raps_sets_core(probs, qhat, u, lam, *, k_reg):
    """:func:`raps_sets` on checked inputs (jitted, no checks)."""
    desc, scores = sorted_scores(probs, u, lam, k_reg)
    return _prefix_sets(probs, desc, scores, qhat.astype(probs.dtype))


def aps_score(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    u: jax.typing.ArrayLike | None = None,
    class_sharded: bool = False,
) -> jax.Array:
    r"""APS (generalised inverse quantile) conformity score, per example.

    .. math::  E(x, y, u) = \rho_x(y) + u\,\hat\pi_x(y)

    Eq. (7) of [1] reads :math:`\rho_x(y) + (1 - u)\hat\pi_x(y)` (the
    smallest threshold whose randomised set of Eq. (5) contains :math:`y`);
    :math:`1 - U` and :math:`U` have the same law, and this form is the one
    of RAPS [2]. ``u=None`` means :math:`u = 1`: the mass up to and including
    :math:`y`.

    Args:
      probs: float ``[N, K]`` class probabilities.
      labels: int ``[N]`` class ids in ``[0, K)``.
      u: optional float ``[N]`` uniforms in ``[0, 1]`` (randomised score).
      class_sharded: static; True: row reductions, no sort (see
        :func:`raps_score`).

    Returns:
      float32 ``[N]`` scores in ``[0, 1]`` (up to rounding).

    References:
      [1] Y. Romano, M. Sesia and E. J. Candès, NeurIPS 2020,
      arXiv:2006.02544v1, Sec. 1.1, Eq. (5) and Sec. 2.1, Eq. (7).
      [2] A. N. Angelopoulos et al., ICLR 2021, arXiv:2009.14193v5, Sec. 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> p = jnp.array([[0.5, 0.3, 0.2]])
      >>> print(conformal.aps_score(p, jnp.array([1])))
      [0.8]
    """
    return raps_score(probs, labels, u=u, lam=0.0, k_reg=0, class_sharded=class_sharded)


def aps_sets(
    probs: jax.typing.ArrayLike,
    qhat: jax.typing.ArrayLike,
    *,
    u: jax.typing.ArrayLike | None = None,
    class_sharded: bool = False,
) -> jax.Array:
    r"""APS prediction sets :math:`\{y : \rho_x(y) + u\,\hat\pi_x(y) \le \hat q\}`.

    Args:
      probs: float ``[N, K]`` class probabilities.
      qhat: scalar threshold (conformal quantile of :func:`aps_score`).
      u: optional float ``[N]`` uniforms (randomised sets); ``None`` means
        :math:`u = 1`.
      class_sharded: static; True: by row reductions (see :func:`raps_sets`).

    Returns:
      bool ``[N, K]`` in class order.

    References:
      [1] Y. Romano, M. Sesia and E. J. Candès, NeurIPS 2020,
      arXiv:2006.02544v1, Sec. 2.2, Algorithm 1 (the set of Eq. (8); the
      roles of :math:`u` and :math:`1 - u` swapped, see :func:`aps_score`).
    """
    return raps_sets(probs, qhat, u=u, lam=0.0, k_reg=0, class_sharded=class_sharded)


# ---------------------------------------------------------------------------
# The split-conformal quantile
# ---------------------------------------------------------------------------


def check_alpha(alpha) -> float:
    """Returns ``alpha`` as float; ValueError unless it is a number in (0, 1)."""
    if isinstance(alpha, jax.core.Tracer):
        raise TypeError(
            "alpha must be a concrete number (it fixes the rank of the conformal "
            "quantile), got a traced value."
        )
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}.") from None
    if isinstance(alpha, bool) or not 0.0 < value < 1.0:  # NaN fails too
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}.")
    return value


def quantile_rank(n: int, alpha: float) -> int:
    r"""The rank :math:`r = \lceil (n + 1)(1 - \alpha) \rceil` of the quantile.

    Computed in exact rational arithmetic on the shortest decimal that
    round-trips ``alpha`` (``0.1`` is read as 1/10, ``0.3`` as 3/10): float
    arithmetic gives ``100 * (1 - 0.45) = 55.00000000000001``, rounded up to
    56 for ``n = 99``, and the exact binary value of ``0.3`` gives rank 8
    instead of 7 for ``n = 9``; both would over-cover.

    Raises:
      ValueError: ``alpha`` outside (0, 1), or :math:`r > n`, i.e.
        :math:`n < 1/\alpha - 1` (the calibration set is too small for the
        guarantee at this level).
    """
    alpha = check_alpha(alpha)
    exact = Fraction(repr(alpha))
    rank = math.ceil((n + 1) * (1 - exact))
    if rank > n:
        raise ValueError(
            f"calibration set too small for alpha={alpha}: n = {n} < 1/alpha - 1 "
            f"= {1 / alpha - 1:.6g} (the ceil((n+1)(1-alpha)) = {rank}-th "
            f"smallest score does not exist); use at least "
            f"{math.ceil(1 / exact - 1)} calibration rows or a larger alpha."
        )
    return rank


def conformal_quantile(scores: jax.typing.ArrayLike, *, alpha: float) -> jax.Array:
    r"""The split-conformal threshold: the :math:`\lceil (n+1)(1-\alpha) \rceil`-th
    smallest calibration score.

    With exchangeable calibration and test points, the set
    :math:`\{y : s(x, y) \le \hat q\}` then covers the test label with
    probability at least :math:`1 - \alpha`, and at most
    :math:`1 - \alpha + 1/(n + 1)` when the scores have no ties (Thm. 2.2 of
    [1], with :math:`n` calibration points). :math:`\hat q` is the exact order
    statistic, i.e. ``np.quantile(scores, r / n, method='inverted_cdf')``;
    ``method='higher'`` at the level :math:`r/n` can return the next order
    statistic (its index is :math:`\lceil (n-1) r / n \rceil`), which only
    over-covers.

    Args:
      scores: float ``[n]`` conformity scores of the labelled calibration rows.
      alpha: static miscoverage level in (0, 1).

    Returns:
      float32 scalar :math:`\hat q`.

    Raises:
      ValueError: ``alpha`` outside (0, 1) or :math:`n < 1/\alpha - 1`.

    References:
      [1] J. Lei, M. G'Sell, A. Rinaldo, R. J. Tibshirani and L. Wasserman,
      "Distribution-Free Predictive Inference for Regression", JASA 2018,
      arXiv:1604.04173v2, Sec. 2.2, Thm. 2.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> s = jnp.arange(1.0, 20.0)  # n = 19: rank ceil(20 * 0.9) = 18
      >>> print(conformal.conformal_quantile(s, alpha=0.1))
      18.0
    """
    scores = _as_float(scores, "scores")
    if scores.ndim != 1:
        raise ValueError(f"scores must have shape [n], got shape {scores.shape}.")
    rank = quantile_rank(scores.shape[0], alpha)
    return order_statistic(scores, rank=rank)


@functools.partial(jax.jit, static_argnames="rank")
def order_statistic(scores, *, rank):
    """The ``rank``-th smallest of ``scores`` (1-based; jitted).

    By its definition, the smallest score :math:`s` with :math:`\\#\\{i : s_i
    \\le s\\} \\ge` ``rank``, found by bisection over the float32 order (bit
    patterns mapped to uint32 keys that order like the floats): 32 counts of
    the scores, each a plain comparison and sum, instead of a sort (much
    slower on XLA:CPU at 5e4 scores; ``benchmarks/RESULTS.md``). The result is
    always one of the scores.
    """
    bits = lax.bitcast_convert_type(scores.astype(jnp.float32) + 0.0, jnp.uint32)
    sign = jnp.uint32(0x80000000)
    # Negative floats: all bits flipped; others: the sign bit set.
    keys = jnp.where(bits >= sign, ~bits, bits | sign)

    def step(i, ans):
        half = jnp.left_shift(jnp.uint32(1), (31 - i).astype(jnp.uint32))
        below = jnp.sum((keys <= ans + (half - 1)).astype(jnp.int32))
        return jnp.where(below < rank, ans + half, ans)

    key = lax.fori_loop(0, 32, step, jnp.uint32(0))
    bits = jnp.where(key >= sign, key & ~sign, ~key)
    return lax.bitcast_convert_type(bits, jnp.float32)
