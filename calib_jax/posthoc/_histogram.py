r"""Histogram binning (Zadrozny & Elkan 2001), top-label and one-vs-rest."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _reduction, _validate

BINNINGS = ("equal_mass", "equal_width")
# An equal-mass threshold at the last score of its group, or midway to the next.
THRESHOLDS = ("data", "midpoint")


# Up to this many thresholds, bins are counted by comparisons, else searched.
_MAX_COMPARE = 32


def bin_index(thresholds, v, cls):
    """Bin ``#{j : v > thresholds[cls, j]}`` (int32) of each score ``v``, ``[N]``
    or ``[N, K]``, of class ``cls`` (same shape); thresholds ascending."""
    t = thresholds.shape[1]
    if t == 0:
        return jnp.zeros(v.shape, jnp.int32)
    if t > _MAX_COMPARE:
        return _reduction.segmented_searchsorted(thresholds, cls, v, side="left")
    # One-vs-rest: the thresholds of column k broadcast over the rows.
    rows = thresholds[None] if v.ndim == 2 else thresholds[cls]
    count = jnp.zeros(v.shape, jnp.int32)
    for j in range(t):
        count = count + (v > rows[..., j]).astype(jnp.int32)
    return count


def _binary_map(params, v, cls):
    """Calibrated probability of each score ``v`` of class ``cls``."""
    thr = params["thresholds"].astype(v.dtype)
    values = params["values"].astype(v.dtype)
    bins = bin_index(thr, v, cls)
    out = values.reshape(-1)[cls * values.shape[1] + bins]
    return jnp.where(params["fitted"][cls], out, v)


def apply_top_label(params, logits):
    """``apply_fn`` of top-label histogram binning (log-probabilities)."""
    return _reduction.apply_top_label(_binary_map, params, logits)


def apply_one_vs_rest(params, logits):
    """``apply_fn`` of one-vs-rest histogram binning (log-probabilities)."""
    return _reduction.apply_one_vs_rest(_binary_map, params, logits)


def check_params(params, *, values: bool = True) -> int:
    """Parameters ``fitted [K]`` bool, ``thresholds [K, M-1]`` ascending and
    ``values [K, M]`` in [0, 1]; returns K."""
    arrays = _base.param_arrays(
        params, {"fitted": 1, "thresholds": 2, "values": 2}, bools=("fitted",)
    )
    k = _base.same_classes(arrays, {"fitted": (0,), "thresholds": (0,), "values": (0,)})
    thr, val = arrays["thresholds"], arrays["values"]
    if thr.shape[1] + 1 != val.shape[1]:
        raise ValueError(
            f"params['values'] must have one bin more than params['thresholds'] "
            f"has thresholds, got shapes {val.shape} and {thr.shape}."
        )
    if values:
        _base.check_param_values("params['thresholds']", thr, ascending=True)
        _base.check_param_values("params['values']", val, unit=True)
    return k


def apply_histogram_binning(
    params, logits: jax.typing.ArrayLike, *, variant: str = "top_label"
) -> jax.Array:
    r"""Applies fitted histogram binning; returns calibrated log-probabilities.

    A score :math:`v` of class :math:`l` falls in bin :math:`b(v) = \#\{j :
    v > t_{l,j}\}` (bins :math:`(t_{l,j}, t_{l,j+1}]`) and is replaced by
    that bin's validation frequency :math:`\theta_{l,b(v)}`; the variants'
    reductions to rows: ``docs/posthoc.md``. Not accuracy-preserving in general.

    Args:
      params: ``{'thresholds': [K, M-1], 'values': [K, M], 'fitted': bool
        [K]}`` from :func:`fit_histogram_binning`.
      logits: float ``[N, K]``.
      variant: ``'top_label'`` or ``'one_vs_rest'`` (the fitted one).

    Returns:
      float ``[N, K]`` log-probabilities (``-inf`` where a bin's value is 0).

    References:
      [1] B. Zadrozny, C. Elkan, "Obtaining calibrated probability estimates
      from decision trees and naive Bayesian classifiers", ICML 2001, Sec. 3.
      [2] C. Gupta, A. Ramdas, "Top-label calibration and multiclass-to-binary
      reductions", ICLR 2022, arXiv:2107.08353v3, Algorithms 2-3.

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"thresholds": jnp.array([[0.7], [0.7]]),
      ...           "values": jnp.array([[0.5, 0.8], [0.5, 0.8]]),
      ...           "fitted": jnp.array([True, True])}
      >>> out = apply_histogram_binning(params, jnp.log(jnp.array([[0.9, 0.1]])))
      >>> print(jnp.exp(out).round(3))
      [[0.8 0.2]]
    """
    _checks.check_choice("variant", variant, _reduction.VARIANTS)
    logits = _core.upcast(logits)
    fn = apply_top_label if variant == "top_label" else apply_one_vs_rest
    return fn(params, logits)


def fit_histogram_binning(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    variant: str = "top_label",
    num_bins: int = 15,
    binning: str = "equal_mass",
    thresholds: str = "data",
) -> dict[str, jax.Array]:
    r"""Fits histogram binning: per-class bins of a score, each replaced by its
    validation frequency.

    For each class :math:`l` (the predicted class for ``'top_label'``, every
    class for ``'one_vs_rest'``), the scores :math:`v_i` of its :math:`n_l`
    validation rows (top-label confidences, or :math:`p_{il}`) and binary
    targets :math:`o_i` (prediction correct, or :math:`1[y_i = l]`) give

    .. math::

        \theta_{l,b} = \frac{\sum_i 1[b(v_i) = b]\, o_i}{\sum_i 1[b(v_i) = b]},
        \qquad b(v) = \#\{j : v > t_{l,j}\},

    the fraction of positives in each bin (Sec. 3 of [1]). ``'equal_mass'``
    thresholds cut the sorted scores into :math:`M` groups of :math:`\lfloor
    n_l / M\rfloor` or :math:`\lceil n_l / M\rceil` (the bins of [2]; tied
    scores share a bin), ``thresholds='midpoint'`` moves them midway to the
    next score ([3]), ``'equal_width'`` uses :math:`t_j = j / M`. A class
    without rows keeps the uncalibrated score (``fitted = False``); empty
    bins, the float32 midpoints: ``docs/posthoc.md``.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      variant: ``'top_label'`` (default; Gupta & Ramdas) or ``'one_vs_rest'``.
      num_bins: static number of bins :math:`M` per class (15).
      binning: ``'equal_mass'`` (default) or ``'equal_width'``.
      thresholds: ``'data'`` (default) or ``'midpoint'`` (needs
        ``binning='equal_mass'``).

    Returns:
      ``{'thresholds': float32 [K, M-1], 'values': float32 [K, M], 'fitted':
      bool [K]}``.

    Raises:
      ValueError: bad option or shapes; for concrete inputs NaN/inf logits or
        labels out of range (one line).

    References:
      [1] B. Zadrozny, C. Elkan, ICML 2001, Sec. 3.
      [2] C. Gupta, A. Ramdas, ICLR 2022, arXiv:2107.08353v3, Sec. 4 (top-label
      histogram binning with equal-mass bins).
      [3] A. Kumar, P. Liang, T. Ma, "Verified Uncertainty Calibration",
      NeurIPS 2019, arXiv:1909.10155v5; its package uncertainty-calibration
      0.1.4, ``calibration/utils.py``, ``get_equal_bins``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> fit_histogram_binning(z, y, num_bins=10)["values"].shape
      (4, 10)
    """
    _checks.check_choice("variant", variant, _reduction.VARIANTS)
    _checks.check_choice("binning", binning, BINNINGS)
    _checks.check_choice("thresholds", thresholds, THRESHOLDS)
    if thresholds == "midpoint" and binning != "equal_mass":
        raise ValueError(
            "thresholds='midpoint' places equal-mass thresholds between order "
            f"statistics; it needs binning='equal_mass', got binning={binning!r}."
        )
    logits, labels, where = _validate.check_inputs(logits, labels, where, values=False)
    num_bins = _checks.check_positive_int("num_bins", num_bins)
    # Values are checked in the scores' pass and raised once the fit is dispatched.
    if variant == "top_label":
        (cls, v), summary = _reduction.checked_top_label(logits, labels, where)
    else:
        cls = None
        v, summary = _reduction.checked_probabilities(logits, labels, where)
    params, accuracy = _fit(
        v,
        cls,
        labels,
        where,
        num_classes=logits.shape[1],
        num_bins=num_bins,
        binning=binning,
        midpoint=thresholds == "midpoint",
    )
    if _checks.is_concrete(logits, labels, where):
        _validate.raise_for_values(summary, logits.shape)
    _validate.warn_if_suspicious(
        logits, labels, where, name="histogram_binning", accuracy=accuracy
    )
    return params


def floor_midpoint(a, b):
    """The largest float32 not above the exact midpoint of float32 ``a <= b``:
    the rounding error of ``a + b`` (Knuth's TwoSum) tells whether the rounded
    half lies above it. So ``v > result`` exactly when ``v > (a + b) / 2``."""
    a = a.astype(jnp.float32)
    b = b.astype(jnp.float32)
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    half = 0.5 * s
    return jnp.where(err < 0, jnp.nextafter(half, jnp.float32(-jnp.inf)), half)


@functools.partial(
    jax.jit, static_argnames=("num_classes", "num_bins", "binning", "midpoint")
)
def _fit(v, cls, labels, where, *, num_classes, num_bins, binning, midpoint=False):
    """Top-label (``v`` confidences ``[N]``, ``cls`` predictions ``[N]``) or
    one-vs-rest (``v`` probabilities ``[N, K]``, ``cls`` None) binning."""
    cls_given = cls is not None
    variant = "top_label" if cls_given else "one_vs_rest"
    n, k = labels.shape[0], num_classes
    labels = labels.astype(jnp.int32)
    keep = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
    columns = jnp.arange(k, dtype=jnp.int32)
    if variant == "top_label":
        group = jnp.where(keep, cls, k)
    else:
        cls = jnp.broadcast_to(columns[None, :], (n, k))
        group = jnp.where(keep[:, None], cls, k)
    v = v.astype(jnp.float32)
    equal_mass = num_bins > 1 and binning == "equal_mass"
    if variant == "one_vs_rest":
        sizes = jnp.full((k,), jnp.sum(keep.astype(jnp.int32)), jnp.int32)
    elif not equal_mass:  # else the order statistics count them
        sizes = jax.ops.segment_sum(jnp.ones((n,), jnp.int32), group, k + 1)[:k]
    count_le = None
    if num_bins == 1:
        thresholds = jnp.zeros((k, 0), jnp.float32)
    elif binning == "equal_width":
        edges = jnp.arange(1, num_bins, dtype=jnp.float32) / num_bins
        thresholds = jnp.broadcast_to(edges[None, :], (k, num_bins - 1))
    else:
        values, count_le, sizes = _reduction.grouped_cut(
            v.reshape(-1),
            group.reshape(-1),
            num_groups=k,
            ranks=functools.partial(
                _reduction.cut_ranks, num_bins=num_bins, midpoint=midpoint
            ),
            top_label_of=k if variant == "top_label" else 0,
        )
        # A class without rows gets thresholds 1 (unused: it is not fitted).
        thresholds = jnp.where(sizes[:, None] > 0, values, 1.0)
        if midpoint:
            # The rows up to the midpoint are those up to the lower score
            # (none lies strictly between the two order statistics).
            count_le = count_le[:, 0::2]
            thresholds = floor_midpoint(thresholds[:, 0::2], thresholds[:, 1::2])
    size = k * num_bins + 1
    if variant == "top_label" and count_le is None:
        # Counts and hits per (predicted class, bin): one scatter over the rows.
        bins = bin_index(thresholds, v, cls)
        seg = jnp.where(group < k, group * num_bins + bins, k * num_bins)
        both = jnp.stack([jnp.ones((n,), jnp.int32), (cls == labels).astype(jnp.int32)])
        sums = jax.vmap(lambda d: jax.ops.segment_sum(d, seg, size))(both)
        count, hits = (a[:-1].reshape(k, num_bins) for a in sums)
    else:
        if variant == "top_label":
            # Equal-mass: the bins' counts are differences of the order statistics'
            # counts; only the correct predictions need a scatter.
            bins = _reduction.segmented_searchsorted(thresholds, cls, v, side="left")
            hit = (group < k) & (cls == labels)
            seg = jnp.where(hit, group * num_bins + bins, k * num_bins)
        else:
            # Positives are the N entries (n, y_n): a scatter over N rows, not N K.
            v_pos = jnp.take_along_axis(v, labels[:, None], axis=1)[:, 0]
            bins = bin_index(thresholds, v_pos, labels)
            seg = jnp.where(keep, labels * num_bins + bins, k * num_bins)
            if count_le is None:  # count_le[k, j] = #{n : v_nk <= t_kj}
                count_le = jnp.zeros((k, 0), jnp.int32)
                for j in range(num_bins - 1):
                    below = (v <= thresholds[None, :, j]) & keep[:, None]
                    below = jnp.sum(below, axis=0)
                    count_le = jnp.concatenate([count_le, below[:, None]], axis=1)
        hits = jax.ops.segment_sum(jnp.ones((n,), jnp.int32), seg, size)
        hits = hits[:-1].reshape(k, num_bins)
        edges = jnp.concatenate(
            [jnp.zeros((k, 1), jnp.int32), count_le, sizes[:, None]], axis=1
        )
        count = jnp.diff(edges, axis=1)
    values = hits.astype(jnp.float32) / jnp.maximum(count, 1).astype(jnp.float32)
    params = {
        "thresholds": thresholds.astype(jnp.float32),
        "values": _fill_empty(values, count > 0),
        "fitted": sizes > 0,
    }
    # Top-label hits are the correct predictions: the accuracy comes free.
    accuracy = jnp.sum(hits) / jnp.maximum(jnp.sum(count), 1) if cls_given else None
    return params, accuracy


def _fill_empty(values, nonempty):
    """Empty bins take the nearest non-empty bin below (else above)."""
    m = values.shape[-1]
    idx = jnp.arange(m, dtype=jnp.int32)[None, :]
    below = jax.lax.cummax(jnp.where(nonempty, idx, -1), axis=1)
    above = jax.lax.cummin(jnp.where(nonempty, idx, m), axis=1, reverse=True)
    src = jnp.where(below >= 0, below, jnp.minimum(above, m - 1))
    return jnp.take_along_axis(values, src, axis=1)
