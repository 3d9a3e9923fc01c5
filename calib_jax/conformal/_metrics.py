r"""Scores of prediction sets: coverage, mean set size and size-stratified
coverage (with its worst violation, the SSCV of RAPS).

Every function takes boolean sets ``[N, K]`` (``True`` = class in the set),
is jittable and accepts an optional ``where`` mask (``False`` rows ignored).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks
from calib_jax.conformal import _scores
from calib_jax.conformal._scores import check_alpha

# The size strata of the RAPS paper's SSCV (inclusive bounds; None = no
# upper bound), chosen there for ImageNet's 1000 classes.
RAPS_STRATA: tuple[tuple[int, int | None], ...] = (
    (0, 1),
    (2, 3),
    (4, 6),
    (7, 10),
    (11, 100),
    (101, None),
)


def _check_sets(sets, labels=None, where=None):
    sets = jnp.asarray(sets)
    if sets.dtype != jnp.bool_:
        raise TypeError(f"sets must be a bool array, got dtype {sets.dtype}.")
    if sets.ndim != 2:
        raise ValueError(f"sets must have shape [N, K], got shape {sets.shape}.")
    n = sets.shape[0]
    where = _checks.check_where(where, n)
    if labels is not None:
        labels = _scores.check_labels(labels, n, sets.shape[1], where)
    return sets, labels, where


def _weights(where, n):
    if where is None:
        return jnp.ones((n,), jnp.float32)
    return where.astype(jnp.float32)


def _covered(sets, labels):
    return jnp.take_along_axis(sets, labels[:, None], axis=1)[:, 0]


def coverage(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Empirical coverage: the fraction of rows whose set contains the label.

    .. math::  \frac{1}{N} \sum_i 1[y_i \in C(x_i)]

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      float32 scalar (NaN when every row is masked).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> sets = jnp.array([[True, False], [True, True], [False, False]])
      >>> print(f"{float(conformal.coverage(sets, jnp.array([0, 1, 1]))):.4f}")
      0.6667
    """
    sets, labels, where = _check_sets(sets, labels, where)
    w = _weights(where, sets.shape[0])
    return jnp.sum(w * _covered(sets, labels)) / jnp.sum(w)


def set_size(
    sets: jax.typing.ArrayLike, *, where: jax.typing.ArrayLike | None = None
) -> jax.Array:
    r"""Mean set size :math:`\frac{1}{N} \sum_i |C(x_i)|` (empty sets count 0).

    The per-row sizes are ``sets.sum(-1)``.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      float32 scalar (NaN when every row is masked).
    """
    sets, _, where = _check_sets(sets, None, where)
    w = _weights(where, sets.shape[0])
    sizes = jnp.sum(sets.astype(jnp.float32), axis=1)
    return jnp.sum(w * sizes) / jnp.sum(w)


def _check_strata(strata) -> tuple[tuple[int, float], ...]:
    try:
        pairs = tuple((lo, hi) for lo, hi in strata)
    except (TypeError, ValueError):
        raise ValueError(
            f"strata must be a sequence of (low, high) size bounds, got {strata!r}."
        ) from None
    if not pairs:
        raise ValueError("strata must hold at least one (low, high) pair.")

    def is_int(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    out = []
    for lo, hi in pairs:
        top = math.inf if hi is None else hi
        if not is_int(lo) or not (hi is None or is_int(hi)) or lo < 0 or top < lo:
            raise ValueError(
                "each stratum must be (low, high) with ints 0 <= low <= high "
                f"(high None = unbounded), got {(lo, hi)!r}."
            )
        out.append((int(lo), top if hi is None else int(hi)))
    return tuple(out)


def size_stratified_coverage(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    strata=RAPS_STRATA,
    where: jax.typing.ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Coverage within each stratum of set sizes.

    For a stratum :math:`[a, b]`, the coverage of the rows whose set size
    :math:`|C(x_i)|` lies in :math:`[a, b]` (the size-stratified coverage of
    Sec. 4 of [1]; a row counts in every stratum containing its size).
    Marginal coverage can hide small sets that under-cover and large sets
    that over-cover; this exposes them.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      strata: static sequence of inclusive ``(low, high)`` size bounds
        (``high=None``: unbounded). Default :data:`RAPS_STRATA`, the strata
        of [1]: 0-1, 2-3, 4-6, 7-10, 11-100, 101+.
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      ``(coverage, count)``: float32 ``[S]`` coverage per stratum (NaN for
      an empty stratum) and int32 ``[S]`` rows per stratum.

    References:
      [1] A. N. Angelopoulos, S. Bates, J. Malik and M. I. Jordan,
      "Uncertainty Sets for Image Classifiers using Conformal Prediction",
      ICLR 2021, arXiv:2009.14193v5, Sec. 4.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> sets = jnp.array([[True, False, False], [True, True, True]])
      >>> cov, count = conformal.size_stratified_coverage(
      ...     sets, jnp.array([1, 2]), strata=((0, 1), (2, 3)))
      >>> print(cov, count)
      [0. 1.] [1 1]
    """
    sets, labels, where = _check_sets(sets, labels, where)
    bounds = _check_strata(strata)
    return _stratified(sets, labels, where, bounds=bounds)


@functools.partial(jax.jit, static_argnames="bounds")
def _stratified(sets, labels, where, *, bounds):
    w = _weights(where, sets.shape[0])
    sizes = jnp.sum(sets.astype(jnp.int32), axis=1)
    lo = jnp.asarray([b[0] for b in bounds], jnp.int32)
    # An unbounded stratum ends at K (no set is larger).
    hi = jnp.asarray([min(b[1], sets.shape[1]) for b in bounds], jnp.int32)
    inside = (sizes[:, None] >= lo[None, :]) & (sizes[:, None] <= hi[None, :])
    member = inside.astype(jnp.float32) * w[:, None]  # [N, S]
    count = jnp.sum(member, axis=0)
    hits = jnp.sum(member * _covered(sets, labels).astype(jnp.float32)[:, None], 0)
    cov = jnp.where(count > 0, hits / jnp.maximum(count, 1.0), jnp.nan)
    return cov, count.astype(jnp.int32)


def size_stratified_violation(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    strata=RAPS_STRATA,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Worst size-stratified coverage violation (SSCV of Sec. 4 of [1]).

    .. math::  \max_{j:\, |S_j| > 0} \bigl| \widehat{\mathrm{cov}}(S_j) - (1 - \alpha) \bigr|

    over the non-empty strata :math:`S_j` of :func:`size_stratified_coverage`.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      alpha: the target miscoverage level in (0, 1).
      strata: static inclusive size bounds (default :data:`RAPS_STRATA`).
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      float32 scalar in ``[0, 1]``.

    References:
      [1] A. N. Angelopoulos et al., ICLR 2021, arXiv:2009.14193v5, Sec. 4.
    """
    alpha = check_alpha(alpha)
    cov, count = size_stratified_coverage(sets, labels, strata=strata, where=where)
    gap = jnp.abs(cov - (1.0 - alpha))
    return jnp.max(jnp.where(count > 0, gap, 0.0))


def _check_num_classes(num_classes, k: int) -> None:
    if num_classes is None:
        return
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, (int, np.integer))
        or int(num_classes) != k
    ):
        raise ValueError(
            f"num_classes must be None or the number of columns of sets, K = {k}, "
            f"got {num_classes!r}."
        )


@jax.jit
def _class_sums(sets, labels, where):
    w = _weights(where, sets.shape[0])
    k = sets.shape[1]
    hits = jax.ops.segment_sum(
        w * _covered(sets, labels).astype(jnp.float32), labels, num_segments=k
    )
    counts = jax.ops.segment_sum(w, labels, num_segments=k)
    return hits, counts


def classwise_coverage_stats(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Mergeable sums of class-conditional coverage: ``(hits, counts)``.

    ``hits[y]`` = :math:`\sum_i 1[y_i = y]\,1[y_i \in C(x_i)]` and
    ``counts[y]`` = :math:`\sum_i 1[y_i = y]` over the unmasked rows. Sums
    of chunks (or of devices' shards) add, and
    :func:`classwise_coverage` is ``hits / counts`` of the totals, so the
    metrics of a test set too large for one call are exact.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      ``(hits, counts)``: float32 ``[K]`` each (exact integers up to 2**24).
    """
    sets, labels, where = _check_sets(sets, labels, where)
    return _class_sums(sets, labels, where)


def classwise_coverage(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    num_classes: int | None = None,
    *,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Class-conditional coverage: per class, the fraction of its rows covered.

    .. math::  \hat c_y = \frac{\sum_i 1[y_i = y]\,1[y_i \in C(x_i)]}
               {\sum_i 1[y_i = y]}

    The quantity whose guarantee :math:`\hat c_y \ge 1 - \alpha` (in
    expectation) class-conditional (Mondrian) conformal prediction gives
    ([1], [2]); a marginal predictor only guarantees the average over rows.
    For chunked or sharded data, add :func:`classwise_coverage_stats` and
    divide once.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      num_classes: optional static int; must equal ``K`` (the columns of
        ``sets``) when given.
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      float32 ``[K]``; NaN for a class without (unmasked) rows.

    References:
      [1] M. Sadinle, J. Lei and L. Wasserman, "Least Ambiguous Set-Valued
      Classifiers with Bounded Error Levels", JASA 2019, arXiv:1609.00451v2
      (class-specific coverage).
      [2] T. Ding, A. N. Angelopoulos, S. Bates, M. I. Jordan and R. J.
      Tibshirani, "Class-Conditional Conformal Prediction with Many
      Classes", NeurIPS 2023, arXiv:2306.09335v2 (the class-conditional
      coverage :math:`\hat c_y` of the CovGap metric).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> sets = jnp.array([[True, False], [False, True], [True, True]])
      >>> print(conformal.classwise_coverage(sets, jnp.array([0, 0, 1])))
      [0.5 1. ]
    """
    sets, labels, where = _check_sets(sets, labels, where)
    _check_num_classes(num_classes, sets.shape[1])
    hits, counts = _class_sums(sets, labels, where)
    return jnp.where(counts > 0, hits / jnp.maximum(counts, 1.0), jnp.nan)


def coverage_gap(
    sets: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""CovGap: mean absolute deviation of class-conditional coverage from 1 - alpha.

    .. math::

        \mathrm{CovGap} = \frac{1}{|\mathcal{Y}'|}
        \sum_{y \in \mathcal{Y}'} \bigl|\hat c_y - (1 - \alpha)\bigr|,

    with :math:`\hat c_y` the coverage of the rows of class :math:`y`
    (:func:`classwise_coverage`) and :math:`\mathcal{Y}'` the classes with
    at least one (unmasked) row; the metric of [1], which reports it
    multiplied by 100 (here a fraction in [0, 1]) and averages over all
    :math:`|\mathcal Y|` classes, every class having test rows there.

    Args:
      sets: bool ``[N, K]`` prediction sets.
      labels: int ``[N]`` class ids in ``[0, K)``.
      alpha: the target miscoverage level in (0, 1).
      where: optional bool ``[N]``; ``False`` rows are ignored.

    Returns:
      float32 scalar (NaN when every row is masked).

    References:
      [1] T. Ding, A. N. Angelopoulos, S. Bates, M. I. Jordan and R. J.
      Tibshirani, "Class-Conditional Conformal Prediction with Many
      Classes", NeurIPS 2023, arXiv:2306.09335v2, Sec. 4 (CovGap).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> sets = jnp.array([[True, False], [False, True], [True, True]])
      >>> gap = conformal.coverage_gap(sets, jnp.array([0, 0, 1]), alpha=0.1)
      >>> print(f"{float(gap):.2f}")  # (|0.5 - 0.9| + |1 - 0.9|) / 2
      0.25
    """
    alpha = check_alpha(alpha)
    sets, labels, where = _check_sets(sets, labels, where)
    hits, counts = _class_sums(sets, labels, where)
    present = counts > 0
    gap = jnp.abs(hits / jnp.maximum(counts, 1.0) - (1.0 - alpha))
    return jnp.sum(jnp.where(present, gap, 0.0)) / jnp.sum(present)
