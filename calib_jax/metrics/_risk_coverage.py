r"""Selective classification beyond AURC: AUGRC, risk at coverage, coverage at risk;
ties in confidence resolved by expectation as :func:`calib_jax.metrics.aurc`
(``docs/metrics.md``, "Selective classification")."""

from __future__ import annotations

import fractions

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common, _inputs, _validate

# A selective risk within this of the target meets it (float32 round-off of E_k / k).
RISK_TOLERANCE = 1e-6


def _ranked(conf, correct, where):
    """``(err, n, start, before, group_err, group_len)`` by decreasing confidence
    (excluded rows last): per row its tie group's start position, the errors
    ahead of the group, and the group's errors and size."""
    size = conf.shape[0]
    valid = _common.mask_or_ones(where, size)
    n = jnp.sum(valid.astype(jnp.int32))
    s, err = _common.sorted_by_confidence(conf, ~correct, valid)
    # Descending valid rows first, excluded last.
    s, err = jnp.roll(s[::-1], n), jnp.roll(err[::-1], n)
    pos = lax.iota(jnp.int32, size)
    err = jnp.where(pos < n, err, 0)
    new = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    group = jnp.cumsum(new.astype(jnp.int32)) - 1
    group_err = jax.ops.segment_sum(err, group, size)[group]
    group_len = jax.ops.segment_sum(jnp.ones_like(err), group, size)[group]
    start = lax.cummax(jnp.where(new, pos, 0))
    cum = jnp.cumsum(err)
    before = cum[start] - err[start]
    return err, n, start, before, group_err, group_len


def _expected_errors(start, before, group_err, group_len, k):
    """``E_k`` (expected errors among the first ``k`` rows), float32."""
    ratio = group_err.astype(jnp.float32) / group_len.astype(jnp.float32)
    return before.astype(jnp.float32) + (k - start).astype(jnp.float32) * ratio


def _augrc_rows(conf, correct, where):
    err, n, start, _, _, group_len = _ranked(conf, correct, where)
    nf = jnp.maximum(n, 1).astype(jnp.float32)
    # Weight of 1-based position j: (N - j + 1/2) / N^2 (trapezoid rule on the
    # generalized risk-coverage curve). Tied rows share the mean position of
    # their group, start + (n_g + 1) / 2.
    mean_pos = start.astype(jnp.float32) + 0.5 * (group_len.astype(jnp.float32) + 1.0)
    weight = (nf - mean_pos + 0.5) / (nf * nf)
    return jnp.sum(jnp.where(err > 0, weight, 0.0))


_augrc_core = jax.jit(_inputs.on_probs(_augrc_rows))
_augrc_rows_core = jax.jit(_augrc_rows)


def augrc(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Area under the generalized risk-coverage curve of the top-label confidence.

    The generalized risk is the fraction of *all* samples that are accepted
    and wrong ([1]), not the selective risk of :func:`aurc`. With rows sorted
    by decreasing confidence and 0/1 errors :math:`e_{(j)}`, the trapezoid
    area under :math:`(k/N, \frac1N \sum_{j \le k} e_{(j)})` is

    .. math::

        \mathrm{AUGRC} = \frac{1}{N^2}\sum_{j=1}^{N} e_{(j)}
        \big(N - j + \tfrac12\big)
        = \tfrac12\,\mathrm{err}^2 + \mathrm{err}\,\mathrm{acc}\,
        (1 - \mathrm{AUROC}_f),

    the "average risk of undetected failures" of [1], with
    :math:`\mathrm{AUROC}_f` the Mann-Whitney AUROC of separating correct
    from wrong predictions by confidence (ties count half). Tied rows get the
    mean weight of the positions their group occupies (as :func:`aurc`).
    Lower is better.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar in [0, 0.5].

    References:
      [1] J. Traub, T. J. Bungert, C. T. Lüth, M. Baumgartner, K. H.
      Maier-Hein, L. Maier-Hein, P. F. Jäger, "Overcoming Common Flaws in the
      Evaluation of Selective Classification Systems", NeurIPS 2024,
      arXiv:2407.01032v1 (definitions of the generalized risk and of the
      AUGRC, and its form in terms of the failure AUROC).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.augrc(probs, labels)):.4f}")
      0.0938
    """
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="augrc"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _augrc_rows_core(conf, correct, where)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _augrc_core(probs, labels, where)


def _fraction(name, value, *, allow_zero):
    """``value`` as a fraction with denominator <= 10**4, checked to lie in range."""
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a number in {interval}, got {value!r}."
        ) from None
    low_ok = x >= 0.0 if allow_zero else x > 0.0
    if not (low_ok and x <= 1.0):
        raise ValueError(f"{name} must lie in {interval}, got {value!r}.")
    return fractions.Fraction(x).limit_denominator(10_000)


def _risk_at_coverage_rows(conf, correct, where, num, den):
    _, n, start, before, group_err, group_len = _ranked(conf, correct, where)
    # k = ceil(n * num / den) in int32 without overflow; 1 <= k <= n.
    q, r = n // den, n % den
    k = jnp.clip(q * num + (r * num + den - 1) // den, 1, jnp.maximum(n, 1))
    i = k - 1  # 0-based position of the last accepted row
    e_k = _expected_errors(start[i], before[i], group_err[i], group_len[i], k)
    return e_k / k.astype(jnp.float32)


_risk_at_coverage_core = jax.jit(_inputs.on_probs(_risk_at_coverage_rows))
_risk_at_coverage_rows_core = jax.jit(_risk_at_coverage_rows)


def risk_at_coverage(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    coverage: float,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Selective risk (error rate) of the most confident fraction ``coverage``.

    The :math:`k = \lceil \mathrm{coverage}\cdot N \rceil` most confident rows
    are accepted (the smallest set covering at least that fraction) and the
    result is their error rate :math:`E_k / k`, the selective risk of [1]; a
    tie group straddling position :math:`k` contributes its error rate per
    accepted row (as :func:`aurc`). ``coverage=1`` is ``1 - accuracy``.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      coverage: fraction in (0, 1], a Python number (read as the nearest fraction with
        denominator <= 10**4, so :math:`k` is an exact integer ceiling);
        coverage 0 is rejected, the risk of an empty selection is undefined.
      where: optional bool ``[N]``; ``False`` rows are excluded (``N`` counts
        the included rows).
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] Y. Geifman, R. El-Yaniv, "Selective Classification for Deep Neural
      Networks", NeurIPS 2017, arXiv:1705.08500v1 (problem setting:
      selective risk and coverage).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.risk_at_coverage(probs, labels, coverage=0.5)):.4f}")
      0.0000
    """
    frac = _fraction("coverage", coverage, allow_zero=False)
    num, den = jnp.int32(frac.numerator), jnp.int32(frac.denominator)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="risk_at_coverage"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _risk_at_coverage_rows_core(conf, correct, where, num, den)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _risk_at_coverage_core(probs, labels, where, num, den)


def _coverage_at_risk_rows(conf, correct, where, risk):
    err, n, start, before, group_err, group_len = _ranked(conf, correct, where)
    size = err.shape[0]
    k = lax.iota(jnp.int32, size) + 1
    e_k = _expected_errors(start, before, group_err, group_len, k)
    ok = (k <= n) & (e_k <= (risk + RISK_TOLERANCE) * k.astype(jnp.float32))
    best = jnp.max(jnp.where(ok, k, 0))
    return best.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)


_coverage_at_risk_core = jax.jit(_inputs.on_probs(_coverage_at_risk_rows))
_coverage_at_risk_rows_core = jax.jit(_coverage_at_risk_rows)


def coverage_at_risk(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    risk: float,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Largest coverage whose selective risk is at most ``risk``.

    .. math::

        \max\Big\{\frac{k}{N} : 1 \le k \le N,\ \frac{E_k}{k} \le
        \mathrm{risk}\Big\},

    with :math:`E_k` the expected number of errors among the :math:`k` most
    confident rows (ties by expectation, as :func:`aurc`). Every :math:`k` is
    considered (selective risk need not be monotone in coverage); the result
    is 0 when no :math:`k` qualifies. A risk within :math:`10^{-6}` above the
    target counts as meeting it (float32 round-off of :math:`E_k / k`).

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      risk: target selective risk in [0, 1] (traceable; checked when
        concrete); ``risk=1`` gives coverage 1.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] Y. Geifman, R. El-Yaniv, "Selective Classification for Deep Neural
      Networks", NeurIPS 2017, arXiv:1705.08500v1 (selection with a target
      risk: the largest coverage whose risk meets it).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.coverage_at_risk(probs, labels, risk=0.25)):.4f}")
      1.0000
    """
    r = jnp.asarray(risk)
    if r.ndim != 0:
        raise ValueError(f"risk must be a scalar in [0, 1], got shape {r.shape}.")
    if _checks.is_concrete(r):
        _fraction("risk", float(r), allow_zero=True)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="coverage_at_risk"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _coverage_at_risk_rows_core(conf, correct, where, r.astype(jnp.float32))
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _coverage_at_risk_core(probs, labels, where, r.astype(jnp.float32))
