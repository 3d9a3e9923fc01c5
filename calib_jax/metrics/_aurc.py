"""AURC and E-AURC of the top-label confidence (sort-based: call once on the
whole split)."""

from __future__ import annotations


import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import digamma

from calib_jax import _checks, kernels
from calib_jax.metrics import _common, _cpu_kernels, _inputs, _validate

OPTIMA = ("exact", "geifman")
# Lanes of the column layout of the tie-group scans on a TPU.
LANES = 128


def _position_weights(n, size, dtype):
    """``alpha_j = (H_n - H_{j-1}) / n`` for 1-based positions ``j <= n``, as
    :func:`_digamma_gap` (no long float32 cumulative sum, no cancellation)."""
    pos = lax.iota(jnp.int32, size) + 1
    nf = jnp.maximum(n, 1).astype(dtype)
    before = (pos - 1).astype(dtype)
    alpha = _digamma_gap(before, jnp.maximum(nf - before, 0.0)) / nf
    return jnp.where(pos <= n, alpha, 0.0)


def _series_terms(a, m):
    """``(x, u, v, uv, s)`` of the asymptotic gap: ``x = a + 1``, ``u = 1/x``,
    ``v = 1/(x + m)``, ``uv = m u v`` and ``s`` with ``S = u s`` the part of
    :math:`H_{a+m} - H_a` beyond ``log1p(m u)``."""
    x = a + 1.0
    u, v = 1.0 / x, 1.0 / (x + m)
    uv = m * u * v
    s = m * v * (0.5 + (u + v) / 12.0 - (u + v) * (u * u + v * v) / 120.0)
    return x, u, v, uv, s


def _digamma_gap(a, m):
    r""":math:`H_{a+m} - H_a` for float ``a, m >= 0`` without cancelling two
    large digammas: from ``a + 1 >= 16`` the asymptotic series of
    :math:`\psi` differenced in closed form (remainder below 1e-9 relative),
    below it the digammas (whose gap is then at least 1/17, or 0)."""
    x, u, _, _, s = _series_terms(a, m)
    series = jnp.log1p(m * u) + u * s
    direct = digamma(x + m) - digamma(x)
    return jnp.where(x >= 16.0, series, direct)


def _x_minus_log1p(r):
    r""":math:`r - \ln(1 + r)` for ``r >= 0`` to float32 precision: up to
    ``r = 1`` the series in :math:`w = r/(2 + r)` of
    :math:`\ln(1 + r) = 2\,\mathrm{artanh}\,w`, above it the difference."""
    w = r / (2.0 + r)
    w2 = w * w
    odd = 0.0
    for k in range(9, 0, -1):
        odd = 1.0 / (2 * k + 1) + w2 * odd
    small = 2.0 * w2 / (1.0 - w) - 2.0 * w * w2 * odd
    return jnp.where(r <= 1.0, small, r - jnp.log1p(r))


def _mean_inner_gap(a, m):
    r""":math:`T = \frac{1}{m}\sum_{s=1}^{m}\frac{s}{a+s} = 1 -
    \frac{a}{m}(H_{a+m} - H_a)`, ``m >= 1``, without cancelling 1 against the
    product for ``a >> m``: :math:`mT = (r - \ln(1+r))/u + \ln(1+r) - (1-u)s`
    with :func:`_series_terms`' ``u, s`` and ``r = m u``."""
    x, u, _, _, s = _series_terms(a, m)
    r = m * u
    series = (_x_minus_log1p(r) / u + jnp.log1p(r) - (1.0 - u) * s) / m
    direct = 1.0 - a / m * (digamma(x + m) - digamma(x))
    out = jnp.where(x >= 16.0, series, direct)
    return jnp.where(m == 1.0, u, out)


def _group_weight(a, m, n):
    r"""Mean of ``alpha_j`` over positions ``j = a + 1 .. a + m`` (``m`` tied
    confidences below ``a`` others): :math:`((H_n - H_{a+m}) + T)/n` with
    :math:`T` of :func:`_mean_inner_gap`, two non-negative terms."""
    b = a + m
    nf = jnp.maximum(n, 1).astype(a.dtype)
    tail = _digamma_gap(b, jnp.maximum(nf - b, 0.0))
    return (tail + _mean_inner_gap(a, m)) / nf


def _tie_sum(dtype, i, last, err, start, run, n):
    """The AURC sum over the rows ending a tie group (``last``), from each
    row's error flag and the starts of its tie group and its error run."""
    # Group [start, i] ends at a row with ``last``; its errors are the run
    # [run, i] when that row is an error. Descending, the group takes the
    # positions a + 1 .. a + m below the a = n - 1 - i more confident rows.
    m = (i + 1 - start).astype(dtype)
    errors = jnp.where(err == 1, i + 1 - run, 0).astype(dtype)
    a = (n - 1 - i).astype(dtype)
    # Tied confidences: every member gets the mean weight of the group's
    # positions (the expectation over orderings of the ties).
    weight = _group_weight(jnp.maximum(a, 0.0), m, n)
    keep = last & (i < n)
    return jnp.sum(jnp.where(keep, errors * weight, 0.0))


def _aurc_flat(conf, correct, valid, n):
    """``(aurc, errors)`` from the sorted ``[N]`` rows (CPU and GPUs)."""
    size = conf.shape[0]
    # Ascending (confidence, error), excluded rows last: inside a group of
    # tied confidences the correct rows come first, the errors last.
    s, err = _common.sorted_by_confidence(conf, ~correct, valid)
    i = lax.iota(jnp.int32, size)
    first = jnp.ones((1,), bool)
    new_group = jnp.concatenate([first, s[1:] != s[:-1]])
    new_run = new_group | jnp.concatenate([first, err[1:] != err[:-1]])
    last = jnp.concatenate([s[1:] != s[:-1], first]) | (i == n - 1)
    start = lax.cummax(jnp.where(new_group, i, 0), axis=0)
    run = lax.cummax(jnp.where(new_run, i, 0), axis=0)
    aurc = _tie_sum(conf.dtype, i, last, err, start, run, n)
    return aurc, jnp.sum(jnp.where(i < n, err, 0))


def _tuned_keys(conf, flag, valid):
    """One unstable sort of ``_cpu_kernels.sort_key`` (equal keys are equal
    integers, so stability is moot)."""
    return lax.sort(_cpu_kernels.sort_key(conf, flag, valid), is_stable=False)


@kernels.dispatch("sort_keys", _tuned_keys)
def _sorted_keys(conf, flag, valid):
    """:func:`_common.sorted_by_confidence`'s pairs as ascending int32 keys
    ``2 bits(conf) + flag`` (excluded rows last, wrapping)."""
    s, f = _common.sorted_by_confidence.plain(conf, flag, valid)
    return lax.bitcast_convert_type(s, jnp.int32) * 2 + f


def _columns(x):
    """``[N]`` as ``[LANES, ceil(N / LANES)]``, row ``j`` at ``[j % LANES,
    j // LANES]`` (zero-padded), so a prefix maximum needs no transposition."""
    size = x.shape[0]
    cols = max(1, -(-size // LANES))
    x = jnp.concatenate([x, jnp.zeros((cols * LANES - size,), x.dtype)])
    return x.reshape(cols, LANES).T


def _column_prefix_max(x):
    """Prefix maximum in row order of :func:`_columns`' layout (``x >= 0``)."""
    y = lax.cummax(x, axis=0)
    tot = lax.cummax(y[-1, :], axis=0)
    before = jnp.concatenate([jnp.zeros((1,), x.dtype), tot[:-1]])
    return jnp.maximum(y, before[None, :])


def _aurc_columns(conf, correct, valid, n):
    """:func:`_aurc_flat` on a TPU: one sort of packed keys in
    :func:`_columns`' layout (a TPU's ``lax.cummax`` over ``[N]`` transposes)."""
    key = _sorted_keys(conf, ~correct, valid)
    size = key.shape[0]
    errors = jnp.sum(jnp.where(lax.iota(jnp.int32, size) < n, key & 1, 0))
    key = lax.optimization_barrier(_columns(key))
    shape = key.shape
    i = lax.broadcasted_iota(jnp.int32, shape, 1) * LANES
    i = i + lax.broadcasted_iota(jnp.int32, shape, 0)
    # The rows before and after in row order: up or down one lane, across to
    # the neighbouring column at the ends (the first and last rows repeat).
    head = jnp.concatenate([key[-1:, :1], key[-1:, :-1]], axis=1)
    tail = jnp.concatenate([key[:1, 1:], key[-1:, -1:]], axis=1)
    prev = jnp.concatenate([head, key[:-1]], axis=0)
    nxt = jnp.concatenate([key[1:], tail], axis=0)
    new_group = ((key >> 1) != (prev >> 1)) | (i == 0)
    new_run = (key != prev) | (i == 0)
    last = ((key >> 1) != (nxt >> 1)) | (i == n - 1)
    start = _column_prefix_max(jnp.where(new_group, i, 0))
    run = _column_prefix_max(jnp.where(new_run, i, 0))
    aurc = _tie_sum(conf.dtype, i, last, key & 1, start, run, n)
    return aurc, errors


def _aurc_rows(conf, correct, where):
    """``(aurc, alpha, errors, n)`` of top-label rows (traceable)."""
    size = conf.shape[0]
    valid = _common.mask_or_ones(where, size)
    n = jnp.sum(valid.astype(jnp.int32))
    flat = {p: _aurc_flat for p in ("cpu", *kernels.GPU_PLATFORMS)}
    aurc, errors = lax.platform_dependent(
        conf, correct, valid, n, **flat, default=_aurc_columns
    )
    alpha = _position_weights(n, size, conf.dtype)
    return aurc, alpha, errors, n


_aurc_core = jax.jit(_inputs.on_probs(_aurc_rows))
_aurc_rows_core = jax.jit(_aurc_rows)


def aurc(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Area under the risk-coverage curve of the top-label confidence.

    Rows sorted by decreasing confidence :math:`c_{(1)} \ge \dots \ge
    c_{(N)}`, with 0/1 error :math:`e_{(j)}` of the top-label prediction:

    .. math::

        \mathrm{AURC} = \frac{1}{N}\sum_{k=1}^{N}\frac{1}{k}\sum_{j=1}^{k}
        e_{(j)} = \sum_{j=1}^{N} e_{(j)}\,\frac{H_N - H_{j-1}}{N},

    the empirical risk-coverage area of [2]; the reweighted-risk form is
    Def. 3.3 of [1]. Tied confidences get the mean weight of the positions
    they occupy (the expected AURC over orderings of the ties), so the value
    does not depend on the row order.

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
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. 3.3.
      [2] Y. Geifman, G. Uziel, R. El-Yaniv, "Bias-Reduced Uncertainty
      Estimation for Deep Neural Classifiers", ICLR 2019 (AURC, E-AURC).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.aurc(probs, labels)):.4f}")
      0.1458
    """
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="aurc"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _aurc_rows_core(conf, correct, where)[0]
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _aurc_core(probs, labels, where)[0]


def _eaurc_rows(conf, correct, where, optimum):
    value, alpha, errors, n = _aurc_rows(conf, correct, where)
    if optimum == "exact":
        pos = lax.iota(jnp.int32, alpha.shape[0])
        best = jnp.sum(jnp.where(pos >= n - errors, alpha, 0.0))
    else:
        r = errors.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)
        rest = jnp.maximum(1.0 - r, 1e-30)
        best = r + jnp.where(r < 1.0, rest * jnp.log(rest), 0.0)
    return value - best


_eaurc_core = jax.jit(_inputs.on_probs(_eaurc_rows), static_argnums=(3,))
_eaurc_rows_core = jax.jit(_eaurc_rows, static_argnums=(3,))


def eaurc(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    optimum: str = "exact",
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Excess AURC: AURC minus the AURC of an oracle ranking.

    .. math::

        \mathrm{E\text{-}AURC} = \mathrm{AURC} - \mathrm{AURC}^*,

    where the oracle ranks every correct prediction above every error
    ([1]). ``optimum='exact'`` uses the discrete estimator of
    :func:`aurc` with the :math:`m` errors in the last positions,
    :math:`\mathrm{AURC}^* = \sum_{j > N - m} (H_N - H_{j-1})/N`, so
    E-AURC >= 0 exactly; ``'geifman'`` uses the closed form
    :math:`\hat r + (1 - \hat r)\ln(1 - \hat r)` of [1] with error rate
    :math:`\hat r = m/N`, which differs by :math:`O(\log N / N)`.

    Args as :func:`aurc`, and ``optimum``: ``'exact'`` or ``'geifman'``.

    Returns:
      float32 scalar.

    References:
      [1] Y. Geifman, G. Uziel, R. El-Yaniv, "Bias-Reduced Uncertainty
      Estimation for Deep Neural Classifiers", ICLR 2019 (AURC, E-AURC).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.eaurc(probs, labels)):.4f}")
      0.0833
    """
    _checks.check_choice("optimum", optimum, OPTIMA)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="eaurc"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _eaurc_rows_core(conf, correct, where, optimum)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _eaurc_core(probs, labels, where, optimum)
