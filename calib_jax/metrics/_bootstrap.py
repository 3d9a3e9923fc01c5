"""Bootstrap percentile intervals for any metric of ``(probs, labels)``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common, _validate

# Gathered float32 entries per block of resamples (2**24 entries = 64 MiB).
BLOCK_ENTRIES = 2**24
# Metrics with another signature than (probs, labels, *, where).
_NOT_BOOTSTRAPPABLE = ("ood_auroc", "ood_aupr", "fpr_at_95_tpr")


class BootstrapResult(NamedTuple):
    """Point estimate, percentile interval and the resampled values.

    Every field has the structure of the metric's output (a scalar, or a
    pytree of scalars for several metrics at once); ``samples`` has a leading
    ``[num_samples]`` axis.
    """

    estimate: Any
    lower: Any
    upper: Any
    samples: Any


def _resolve(metric) -> Callable:
    from calib_jax import metrics as registry  # here: the package imports this module

    def one(m, label):
        if isinstance(m, str):
            if m in _NOT_BOOTSTRAPPABLE:
                raise ValueError(
                    f"metric {m!r} takes (scores_in, scores_out), not (probs, labels); "
                    "bootstrap needs a metric of (probs, labels)."
                )
            return registry.get_metric(m)
        if not callable(m):
            raise TypeError(
                f"metric {label} must be a callable or a registered metric name, "
                f"got {m!r}."
            )
        return m

    if isinstance(metric, Mapping):
        if not metric:
            raise ValueError("metric is an empty mapping: nothing to bootstrap.")
        return _Several(tuple((name, one(m, repr(name))) for name, m in metric.items()))
    return one(metric, "")


@dataclasses.dataclass(frozen=True)
class _Several:
    """Several metrics as one function returning a dict (hashable: jit-static)."""

    items: tuple[tuple[str, Callable], ...]

    def __call__(self, probs, labels, **kw):
        return {name: fn(probs, labels, **kw) for name, fn in self.items}


def resample_indices(key, sample: int, num_rows: int, num_included) -> jax.Array:
    """Row positions of bootstrap resample ``sample`` (jittable).

    Draws ``jax.random.randint(jax.random.fold_in(key, sample), (num_rows,), 0,
    num_included)``: positions among the included rows, in row order; only the
    first ``num_included`` draws are used (the rest are masked out). Exposed
    so the resamples of :func:`bootstrap` can be reproduced.
    """
    sub = jax.random.fold_in(key, sample)
    return jax.random.randint(sub, (num_rows,), 0, num_included)


def _count(name, value) -> int:
    """``value`` as int; ValueError unless it is a Python int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a Python int >= 1, got {value!r}.")
    return int(value)


def _call(fn, probs, labels, where):
    return fn(probs, labels) if where is None else fn(probs, labels, where=where)


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def _bootstrap_core(fn, probs, labels, where, key, confidence, num_samples, block):
    size = probs.shape[0]
    valid = _common.mask_or_ones(where, size)
    n = jnp.sum(valid.astype(jnp.int32))
    # Included rows first, in row order (a stable sort of the exclusion flag).
    rows = jnp.argsort(~valid, stable=True)
    tail = None if where is None else lax.iota(jnp.int32, size) < n

    def one(b):
        idx = rows[resample_indices(key, b, size, n)]
        return _call(fn, probs[idx], labels[idx], tail)

    # Equal blocks (a few surplus resamples are drawn and dropped) so the
    # vmapped body is compiled once, without a remainder block.
    num_blocks = -(-num_samples // block)
    block = -(-num_samples // num_blocks)
    ids = jnp.arange(num_blocks * block, dtype=jnp.int32).reshape(num_blocks, block)
    samples = lax.map(jax.vmap(one), ids)
    samples = jax.tree.map(
        lambda s: s.reshape(-1)[:num_samples].astype(jnp.float32), samples
    )
    estimate = _call(fn, probs, labels, where)
    alpha = 0.5 * (1.0 - confidence)
    q = jnp.stack([alpha, 1.0 - alpha]).astype(jnp.float32)

    def interval(s):
        return jnp.quantile(s, q, axis=0, method="linear")

    bounds = jax.tree.map(interval, samples)
    lower = jax.tree.map(lambda b: b[0], bounds)
    upper = jax.tree.map(lambda b: b[1], bounds)
    return BootstrapResult(estimate, lower, upper, samples)


def _check_key(key):
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"key must be a single PRNG key, got shape {key.shape}.")
        return key
    if key.dtype != jnp.uint32 or key.shape != (2,):
        raise ValueError(
            "key must be a jax.random.key(...) or jax.random.PRNGKey(...), got "
            f"dtype {key.dtype} and shape {key.shape}."
        )
    return key


def bootstrap(
    metric: str | Callable | Mapping[str, str | Callable],
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_samples: int,
    key: jax.Array,
    confidence: float = 0.95,
    where: jax.typing.ArrayLike | None = None,
    block_size: int | None = None,
) -> BootstrapResult:
    r"""Bootstrap percentile confidence interval of a metric.

    Resample :math:`b = 0, \dots, B-1` draws :math:`n` of the :math:`n`
    included rows uniformly with replacement (:func:`resample_indices`:
    ``jax.random.fold_in(key, b)``), the metric :math:`\hat\theta^{*}_b` is
    computed on each resample, and the interval is the percentile interval
    of [1] (Sec. 13.3),

    .. math::

        [\hat\theta^{*}_{(\alpha/2)},\ \hat\theta^{*}_{(1-\alpha/2)}],
        \qquad \alpha = 1 - \mathrm{confidence},

    with the quantiles of the :math:`B` resampled values interpolated
    linearly (NumPy's default ``method='linear'``). ``estimate`` is the
    metric on the full data, not the resample mean.

    ``metric`` is a registered name (``'ece'``), a callable ``fn(probs,
    labels)`` returning a scalar or a pytree of scalars (it is called with
    ``where=`` only when ``where`` is given), or a mapping ``{name: metric}``,
    which evaluates every metric on the *same* resamples in one pass. Use
    ``functools.partial`` for options, e.g. ``partial(metrics.ece,
    num_bins=10)``. The inputs are validated once here; the resamples are
    vmapped over blocks of ``block_size`` under ``lax.map``, by default at
    most :math:`2^{24}` gathered ``[block, N, K]`` entries (64 MiB in
    float32), so memory does not grow with ``num_samples``.

    Args:
      metric: name, callable or mapping of names to either.
      probs: float ``[N, K]`` rows on the probability simplex.
      labels: int ``[N]`` class ids in ``[0, K)``.
      num_samples: static number of resamples :math:`B` >= 1.
      key: a ``jax.random.key`` or legacy ``PRNGKey``.
      confidence: interval level in (0, 1), default 0.95 (traceable).
      where: optional bool ``[N]``; ``False`` rows are neither resampled nor
        counted (each resample has as many rows as are included).
      block_size: static resamples per vmapped block (default: the budget).

    Returns:
      :class:`BootstrapResult` ``(estimate, lower, upper, samples)``, float32
      with the structure of the metric's output (``samples`` with a leading
      ``[num_samples]`` axis).

    References:
      [1] B. Efron, R. J. Tibshirani, "An Introduction to the Bootstrap",
      Chapman & Hall 1993, Ch. 13 (percentile intervals).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> res = metrics.bootstrap("accuracy", probs, labels, num_samples=200,
      ...                         key=jax.random.key(0))
      >>> print(f"{float(res.estimate):.2f}", float(res.lower) <= 0.75)
      0.75 True
    """
    fn = _resolve(metric)
    num_samples = _count("num_samples", num_samples)
    conf = jnp.asarray(confidence, jnp.float32)
    if conf.ndim != 0:
        raise ValueError(f"confidence must be a scalar, got shape {conf.shape}.")
    if _checks.is_concrete(conf) and not 0.0 < float(conf) < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}.")
    key = _check_key(key)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    out = jax.eval_shape(lambda p, y, w: _call(fn, p, y, w), probs, labels, where)
    for leaf in jax.tree.leaves(out):
        if getattr(leaf, "shape", None) != ():
            raise ValueError(
                "bootstrap needs a metric returning a scalar (or a pytree of "
                f"scalars); got an output of shape {getattr(leaf, 'shape', leaf)}."
            )
    n_rows, k = probs.shape
    if block_size is None:
        block = max(1, min(num_samples, BLOCK_ENTRIES // max(n_rows * k, 1)))
    else:
        block = min(_count("block_size", block_size), num_samples)
    return _bootstrap_core(fn, probs, labels, where, key, conf, num_samples, block)
