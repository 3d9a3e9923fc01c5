r"""Isotonic regression calibration (exact pool-adjacent-violators), top-label
and one-vs-rest."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _reduction, _validate


def _binary_map(params, v, cls):
    """Piecewise-linear interpolation through class ``cls``'s knots, clipped."""
    x = params["x"].astype(v.dtype)
    y = params["y"].astype(v.dtype)
    m = x.shape[1]
    i = _reduction.segmented_searchsorted(x, cls, v, side="right") - 1
    i0 = jnp.clip(i, 0, m - 2)
    base = cls * m + i0
    xf, yf = x.reshape(-1), y.reshape(-1)
    x0, x1 = xf[base], xf[base + 1]
    y0, y1 = yf[base], yf[base + 1]
    gap = x1 - x0
    t = jnp.where(gap > 0, (v - x0) / jnp.where(gap > 0, gap, 1.0), 0.0)
    t = jnp.clip(t, 0.0, 1.0)
    return y0 + t * (y1 - y0)


def apply_top_label(params, logits):
    """``apply_fn`` of top-label isotonic regression (log-probabilities)."""
    return _reduction.apply_top_label(_binary_map, params, logits)


def apply_one_vs_rest(params, logits):
    """``apply_fn`` of one-vs-rest isotonic regression (log-probabilities)."""
    return _reduction.apply_one_vs_rest(_binary_map, params, logits)


def check_params(params, *, values: bool = True) -> int:
    """Knots ``x [K, M]`` ascending, ``y [K, M]`` non-decreasing in [0, 1],
    ``M >= 2``; returns K."""
    arrays = _base.param_arrays(params, {"x": 2, "y": 2})
    k = _base.same_classes(arrays, {"x": (0,), "y": (0,)})
    x, y = arrays["x"], arrays["y"]
    if x.shape != y.shape or x.shape[1] < 2:
        raise ValueError(
            "params['x'] and params['y'] must have the same shape [K, M] with "
            f"M >= 2 knots, got {x.shape} and {y.shape}."
        )
    if values:
        _base.check_param_values("params['x']", x, ascending=True)
        _base.check_param_values("params['y']", y, unit=True, ascending=True)
    return k


def apply_isotonic(
    params, logits: jax.typing.ArrayLike, *, variant: str = "top_label"
) -> jax.Array:
    r"""Applies fitted isotonic regression; returns calibrated log-probabilities.

    The map of class :math:`l` interpolates linearly between its knots
    :math:`(x_{l,i}, y_{l,i})` and is constant beyond the first and last knot
    (scikit-learn's ``IsotonicRegression(out_of_bounds='clip')``).
    ``variant`` decides the reduction (``docs/posthoc.md``). Pure and
    jittable. Not accuracy-preserving in general.

    Args:
      params: ``{'x': float32 [K, L], 'y': float32 [K, L]}`` from
        :func:`fit_isotonic`.
      logits: float ``[N, K]``.
      variant: ``'top_label'`` or ``'one_vs_rest'`` (the fitted one).

    Returns:
      float ``[N, K]`` log-probabilities.

    References:
      [1] B. Zadrozny, C. Elkan, "Transforming Classifier Scores into Accurate
      Multiclass Probability Estimates", KDD 2002, Sec. 3.

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"x": jnp.array([[0.5, 1.0], [0.5, 1.0]]),
      ...           "y": jnp.array([[0.5, 0.7], [0.5, 0.7]])}
      >>> out = apply_isotonic(params, jnp.log(jnp.array([[0.75, 0.25]])))
      >>> print(jnp.exp(out).round(3))
      [[0.6 0.4]]
    """
    _checks.check_choice("variant", variant, _reduction.VARIANTS)
    logits = _core.upcast(logits)
    fn = apply_top_label if variant == "top_label" else apply_one_vs_rest
    return fn(params, logits)


def fit_isotonic(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    variant: str = "top_label",
) -> dict[str, jax.Array]:
    r"""Fits isotonic-regression calibration by exact pool-adjacent-violators.

    For each class :math:`l` (the predicted class for ``'top_label'``, every
    class for ``'one_vs_rest'``; reductions: ``docs/posthoc.md``),
    with scores :math:`v_i` (top-label confidences, or :math:`p_{il}`) and
    binary targets :math:`o_i` (prediction correct, or :math:`1[y_i = l]`),
    the fitted values solve

    .. math::

        \min_{\hat o}\; \sum_i (o_i - \hat o_i)^2 \quad \text{s.t.}\quad
        v_i \le v_j \Rightarrow \hat o_i \le \hat o_j,

    the non-decreasing least-squares fit of [1] (Sec. 3). Rows with equal
    scores are first pooled into one point weighted by their number (their
    mean target), as scikit-learn's ``IsotonicRegression`` does; then
    pool-adjacent-violators [2] gives the exact solution. The map keeps the
    first and last score of every constant block as knots and interpolates
    linearly between them (:func:`apply_isotonic`), which reproduces
    scikit-learn's ``IsotonicRegression(out_of_bounds='clip')`` predictions.
    A class with no rows (never predicted, for ``'top_label'``) gets the
    identity map.

    **Host function** (the number of knots depends on the data): not
    jittable; the returned map (:func:`apply_isotonic`) is.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      variant: ``'top_label'`` (default) or ``'one_vs_rest'``.

    Returns:
      ``{'x': float32 [K, L], 'y': float32 [K, L]}``: each class's knots,
      ``x`` strictly increasing, padded to the longest class by repeating the
      last knot (at least 2 knots).

    Raises:
      ValueError: bad option or shapes, traced inputs, NaN/inf logits or
        labels out of range (one line).

    References:
      [1] B. Zadrozny, C. Elkan, "Transforming Classifier Scores into Accurate
      Multiclass Probability Estimates", KDD 2002, Sec. 3.
      [2] R. E. Barlow, D. J. Bartholomew, J. M. Bremner, H. D. Brunk,
      "Statistical Inference under Order Restrictions", Wiley 1972 (the
      pool-adjacent-violators algorithm).
      [3] C. Gupta, A. Ramdas, "Top-label calibration and multiclass-to-binary
      reductions", ICLR 2022, arXiv:2107.08353v3, Sec. 4 (top-label
      reduction).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> params = fit_isotonic(z, y)
      >>> bool((jnp.diff(params["y"], axis=1) >= 0).all())
      True
    """
    _checks.check_choice("variant", variant, _reduction.VARIANTS)
    logits, labels, where = _validate.check_inputs(logits, labels, where, values=False)
    if not _checks.is_concrete(logits, labels, where):
        raise ValueError(
            "fit_isotonic runs on the host (its knots have no static shape): "
            "call it outside jax.jit/jax.vmap; apply_isotonic is jittable."
        )
    k = logits.shape[1]
    keep = None if where is None else np.asarray(where)
    on_host = jax.default_backend() == "cpu"
    # The value check shares the scores' read of the logits.
    if variant == "top_label":
        (pred, conf), summary = _reduction.checked_top_label(logits, labels, where)
        cls, keys, counts, accuracy = _top_label_keys(
            pred, conf, labels, where, num_classes=k, sort=not on_host
        )
        _validate.raise_for_values(summary, logits.shape)
        cls, keys, counts = np.asarray(cls), np.array(keys), np.asarray(counts)
        if on_host:
            # Group the rows by class, then sort each class's keys in place
            # (NumPy's sort is faster than XLA:CPU's).
            small = np.uint8 if k < 256 else np.uint16 if k < 65536 else np.int32
            keys = keys[np.argsort(cls.astype(small), kind="stable")]
        ends = np.cumsum(counts)
        groups = [keys[e - c : e] for c, e in zip(counts, ends)]
        if on_host:
            for g in groups:
                g.sort()
    else:
        p, summary = _reduction.checked_probabilities(logits, labels, where)
        keys = _one_vs_rest_keys(p, labels, where, sort=not on_host)
        _validate.raise_for_values(summary, logits.shape)
        keys = np.array(keys)
        if on_host:
            keys.sort(axis=1)
        # Excluded rows carry the largest key and sort last.
        n_keep = keys.shape[1] if keep is None else int(keep.sum())
        groups = list(keys[:, :n_keep])
        accuracy = None
    knots = [_knots(g) for g in groups]
    length = max(2, max(len(x) for x, _ in knots))
    xs = np.stack([_pad(x, length) for x, _ in knots])
    ys = np.stack([_pad(y, length) for _, y in knots])
    params = {"x": jnp.asarray(xs), "y": jnp.asarray(ys)}
    _validate.warn_if_suspicious(
        logits, labels, where, name="isotonic", accuracy=accuracy
    )
    return params


# Key of an excluded row: above every packed key (those are below 2**31).
_EXCLUDED = np.uint32(0xFFFFFFFF)


def _pack(v, target):
    """uint32 keys ``bits(v) << 1 | target``, ordered by score, then target
    (scores in [0, 1] have bits below 2**30)."""
    return (_reduction.float_bits(v) << 1) | target.astype(jnp.uint32)


@functools.partial(jax.jit, static_argnames=("num_classes", "sort"))
def _top_label_keys(pred, conf, labels, where, *, num_classes, sort):
    """``(class [N], key [N], rows per class [K], accuracy)``; excluded rows
    get class ``K``. With ``sort``, sorted by (class, key)."""
    correct = pred == labels
    keys = _pack(conf, correct)
    cls = pred if where is None else jnp.where(where, pred, num_classes)
    counts = jax.ops.segment_sum(jnp.ones_like(cls), cls, num_classes + 1)
    kept = cls < num_classes
    accuracy = jnp.sum(correct & kept) / jnp.maximum(jnp.sum(kept), 1)
    if sort:
        cls, keys = jax.lax.sort((cls, keys), num_keys=2)
    return cls, keys, counts[:num_classes], accuracy


@functools.partial(jax.jit, static_argnames="sort")
def _one_vs_rest_keys(p, labels, where, *, sort):
    """uint32 ``[K, N]``: row ``k`` packs ``p_k`` with ``1[y = k]``; excluded
    rows get the largest key. With ``sort``, each row sorted."""
    k = p.shape[1]
    keys = _pack(p, labels[:, None] == jnp.arange(k)[None, :])
    if where is not None:
        keys = jnp.where(where[:, None], keys, _EXCLUDED)
    keys = keys.T
    return jnp.sort(keys, axis=1) if sort else keys


def _knots(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knots ``(x, y)`` of the isotonic fit of sorted packed keys.

    Exact with the runs of equal targets as PAV input (the fit gives adjacent
    equal targets equal values), except that a tie group holding both targets
    is one block of its own.
    """
    from scipy.optimize import isotonic_regression

    n = keys.size
    if n == 0:
        return np.array([0.0, 1.0], np.float32), np.array([0.0, 1.0], np.float32)
    target = keys & np.uint32(1)
    change = np.flatnonzero(target[1:] != target[:-1]) + 1  # run starts after 0
    xb = keys >> np.uint32(1)
    mixed = xb[change] == xb[change - 1]  # a run boundary inside a tie group
    if mixed.any():
        tied = xb[change[mixed]]
        ends = np.concatenate(
            [np.searchsorted(xb, tied, "left"), np.searchsorted(xb, tied, "right")]
        )
        # Two sorted runs: a stable (merge) sort is linear; then drop repeats.
        change = np.concatenate(
            [change[~mixed], np.sort(ends[(ends > 0) & (ends < n)])]
        )
        change.sort(kind="stable")
        change = change[np.append(True, change[1:] != change[:-1])]
    bounds = np.concatenate([[0], change, [n]])
    count = np.diff(bounds)
    first_target = target[bounds[:-1]].astype(np.int64)
    pos = first_target * count
    if mixed.any():
        # Blocks that are mixed tie groups: their positives by a search.
        start_x = xb[bounds[:-1]]
        is_group = (first_target == 0) & (xb[bounds[1:] - 1] == start_x)
        is_group &= target[bounds[1:] - 1] == 1
        ones = np.searchsorted(keys, (start_x[is_group] << np.uint32(1)) | 1, "left")
        pos[is_group] = bounds[1:][is_group] - ones
    fitted = isotonic_regression(pos / count, weights=count).x
    # Blocks of equal fitted value; knots at their first and last score.
    block = np.empty(fitted.size, bool)
    block[0] = True
    np.not_equal(fitted[1:], fitted[:-1], out=block[1:])
    block_starts = np.flatnonzero(block)
    block_bounds = bounds[np.append(block_starts, fitted.size)]
    first = xb[block_bounds[:-1]].view(np.float32)
    last = xb[block_bounds[1:] - 1].view(np.float32)
    value = fitted[block_starts].astype(np.float32)
    kx = np.stack([first, last], axis=1).reshape(-1)
    ky = np.repeat(value, 2)
    keep = np.ones(kx.size, bool)
    keep[1::2] = last != first
    return kx[keep], ky[keep]


def _pad(a: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([a, np.full(length - a.size, a[-1], a.dtype)])
