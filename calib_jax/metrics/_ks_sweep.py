r"""Calibration errors without a fixed bin count: KS error and monotonic sweep (both
sort the split's top-label confidences: collect the split, then call)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common, _inputs, _validate


def _sorted_top_label(conf, correct, where):
    valid = _common.mask_or_ones(where, conf.shape[0])
    n = jnp.sum(valid.astype(jnp.int32))
    s, a = _common.sorted_by_confidence(conf, correct, valid)
    s = jnp.where(lax.iota(jnp.int32, s.shape[0]) < n, s, jnp.inf)
    return s, a, n


def _ks_rows(conf, correct, where):
    s, a, n = _sorted_top_label(conf, correct, where)
    size = s.shape[0]
    r = lax.iota(jnp.int32, size)
    included = r < n
    diff = jnp.cumsum(jnp.where(included, s - a.astype(s.dtype), 0.0))
    # Evaluate only where the confidence changes (end of a group of ties), so
    # the value does not depend on the order of tied rows.
    last_of_group = jnp.concatenate([s[1:] != s[:-1], jnp.ones((1,), bool)])
    at = included & (last_of_group | (r == n - 1))
    return jnp.max(jnp.where(at, jnp.abs(diff), 0.0)) / jnp.maximum(n, 1)


_ks_core = jax.jit(_inputs.on_probs(_ks_rows))
_ks_rows_core = jax.jit(_ks_rows)


def ks_error(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Kolmogorov-Smirnov calibration error of the top label (binning-free).

    With the top-label confidences sorted ascending, the KS error is the
    largest gap between the cumulative accuracy and the cumulative confidence,

    .. math::

        \mathrm{KS} = \max_{\sigma}\Big|\frac{1}{N}\sum_{i:\,c_i \le \sigma}
        (a_i - c_i)\Big|,

    the KS calibration error of [1]. The maximum runs over the distinct confidence
    values :math:`\sigma`, so tied confidences enter together and the result
    is independent of the row order.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] K. Gupta et al., "Calibration of Neural Networks using Splines",
      ICLR 2021 (KS calibration error).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.ks_error(probs, labels)):.3f}")
      0.100
    """
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="ks_error"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _ks_rows_core(conf, correct, where)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(_ks_core, probs, labels, where)


def _sweep_rows(conf, correct, where, p, max_bins):
    s, a, n = _sorted_top_label(conf, correct, where)
    size = s.shape[0]
    r = lax.iota(jnp.int32, size)
    included = r < n
    a = jnp.where(included, a, 0)
    gap = jnp.where(included, s - a.astype(s.dtype), 0.0)
    zero_i = jnp.zeros((1,), jnp.int32)
    cum_a = jnp.concatenate([zero_i, jnp.cumsum(a)])
    cum_gap = jnp.concatenate([jnp.zeros((1,), s.dtype), jnp.cumsum(gap)])
    # next_start[r]: first index >= r where a new confidence value starts.
    new = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    starts = jnp.where(new, r, size)
    next_start = lax.cummin(jnp.concatenate([starts, jnp.array([size])]), reverse=True)
    k = jnp.arange(max_bins + 1, dtype=jnp.int32)

    def bins_of(b):
        # Equal-mass ('rank') cut points of b bins, moved past tied values.
        q, rem = n // b, n % b
        raw = jnp.where(k <= rem, k * (q + 1), rem * (q + 1) + (k - rem) * q)
        raw = jnp.where(k <= b, jnp.minimum(raw, n), n)
        cut = jnp.where(raw >= n, n, next_start[jnp.minimum(raw, size)])
        lo, hi = cut[:-1], cut[1:]
        count = hi - lo
        correct = cum_a[hi] - cum_a[lo]
        gap_sum = cum_gap[hi] - cum_gap[lo]
        return count, correct, gap_sum

    def monotone(b):
        count, correct, _ = bins_of(b)
        nonempty = count > 0
        acc = correct.astype(jnp.float32) / jnp.maximum(count, 1).astype(jnp.float32)
        # Running max of the accuracies of the non-empty bins before each bin.
        prev = lax.cummax(jnp.where(nonempty, acc, -1.0))
        prev = jnp.concatenate([jnp.full((1,), -1.0), prev[:-1]])
        return jnp.all(jnp.where(nonempty, acc >= prev, True))

    limit = jnp.minimum(n, max_bins)

    def cond(state):
        b, ok = state
        return ok & (b < limit)

    def body(state):
        b, _ = state
        ok = monotone(b + 1)
        return jnp.where(ok, b + 1, b), ok

    best, _ = lax.while_loop(cond, body, (jnp.int32(1), jnp.bool_(True)))
    count, _, gap_sum = bins_of(best)
    c = count.astype(jnp.float32)
    denom = jnp.maximum(n, 1).astype(jnp.float32)
    if p == 1:
        return jnp.sum(jnp.abs(gap_sum)) / denom
    return jnp.sqrt(jnp.sum(gap_sum * gap_sum / jnp.maximum(c, 1.0)) / denom)


_sweep_core = jax.jit(_inputs.on_probs(_sweep_rows), static_argnums=(3, 4))
_sweep_rows_core = jax.jit(_sweep_rows, static_argnums=(3, 4))


def sweep_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    p: float = 1,
    max_bins: int | None = None,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Monotonic-sweep ECE of Roelofs et al. (2022), equal-mass bins.

    The number of equal-mass bins is the largest :math:`b` for which the bin
    accuracies of every binning with :math:`1, \dots, b` bins are monotone
    (non-decreasing in confidence):

    .. math::

        b^* = \max\{b \le N : \mathrm{acc}^{(b')}_1 \le \dots \le
        \mathrm{acc}^{(b')}_{b'}\ \forall b' \le b\},\qquad
        \mathrm{ECE}_{\mathrm{sweep}} = \Big(\sum_{j=1}^{b^*}\frac{n_j}{N}
        |\mathrm{acc}_j - \mathrm{conf}_j|^p\Big)^{1/p},

    the monotonic sweep estimator of [1]. The sweep stops at the first non-monotone
    :math:`b`. Bins follow the ``'rank'`` equal-mass rule of
    :func:`adaptive_ece` (ties kept together; bins emptied by ties are
    ignored by the monotonicity check).

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      p: 1 or 2.
      max_bins: static upper bound of the sweep (default ``N``); the cost is
        ``O(b^* * max_bins)`` after the sort.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar.

    References:
      [1] R. Roelofs, N. Cain, J. Shlens, M. C. Mozer, "Mitigating Bias in
      Calibration Error Estimation", AISTATS 2022 (ECE_sweep).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.sweep_ece(probs, labels)):.3f}")
      0.150
    """
    p = _validate.check_p(p)
    limit = None if max_bins is None else _checks.check_num_bins(max_bins)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="sweep_ece"
    )
    if rows is not None:
        (conf, correct), where = rows
        size = conf.shape[0]
        bins = size if limit is None else min(limit, size)
        return _sweep_rows_core(conf, correct, where, p, bins)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    size = probs.shape[0]
    limit = size if limit is None else limit
    return _validate.evaluate(_sweep_core, probs, labels, where, p, min(limit, size))
