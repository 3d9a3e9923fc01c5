r"""Class-wise and marginal calibration errors, and the debiased l2 ECE."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.metrics import (
    _adaptive,
    _binned_stats,
    _common,
    _conventions,
    _inputs,
    _kernels,
    _validate,
)
from calib_jax.metrics._ece import BINNINGS


def _per_class_equal_mass(probs, labels, valid, num_bins, rule):
    """``[K, M]`` equal-mass statistics, one sort per class (vmapped)."""
    probs = _common.as_float(probs)
    k = probs.shape[1]
    outcome = labels.astype(jnp.int32)[None, :] == jnp.arange(k)[:, None]

    def one(conf, correct):
        return _adaptive.equal_mass_stats(conf, correct, valid, num_bins, rule)[:4]

    count, sum_conf, sum_correct, n = jax.vmap(one)(probs.T, outcome)
    return count, sum_conf, sum_correct, n[0]


def _class_stats(probs, labels, where, num_bins, binning, convention, screen):
    """``((count, sum_conf, sum_correct, n), sums)``, ``sums`` the value
    screen's row sums when ``screen`` with equal-width bins, else None."""
    valid = _common.mask_or_ones(where, probs.shape[0])
    if binning == "equal_width":
        out = _binned_stats.stats_from_batch(
            probs, labels, where, num_bins, convention, True, screen
        )
        s, sums = out if screen else (out, None)
        return (s.count, s.sum_conf, s.sum_correct, s.total), sums
    stats = _per_class_equal_mass(probs, labels, valid, num_bins, convention.equal_mass)
    return stats, None


def _debiased_square(count, sum_conf, sum_correct, total):
    """Debiased squared error (no root) summed over the last axis, bins with
    ``n_b >= 2``: the formula of :func:`debiased_ece`."""
    n_b = count.astype(jnp.float32)
    keep = n_b >= 2
    safe = jnp.where(keep, n_b, 2.0)
    acc = sum_correct.astype(jnp.float32) / safe
    gap = sum_conf.astype(jnp.float32) / safe - acc
    term = gap * gap - acc * (1.0 - acc) / (safe - 1.0)
    denom = jnp.maximum(jnp.asarray(total, jnp.float32), 1.0)
    return jnp.sum(jnp.where(keep, n_b * term, 0.0), axis=-1) / denom


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7, 8))
def _classwise_core(
    probs, labels, where, num_bins, binning, convention, p, mode, screen=False
):
    """The class-wise error; with ``screen`` also the value screen's row sums
    (``None`` for equal-mass bins)."""
    (count, sum_conf, sum_correct, n), sums = _class_stats(
        probs, labels, where, num_bins, binning, convention, screen
    )
    if mode == "debiased":
        per_class = jnp.maximum(_debiased_square(count, sum_conf, sum_correct, n), 0.0)
        out = jnp.sqrt(jnp.mean(per_class))
    else:
        if mode == "marginal":
            convention = _conventions.Convention(
                name=convention.name,
                min_count=convention.min_count,
                l2_root="after_mean",
            )
        out = _binned_stats.classwise_error(
            count, sum_conf, sum_correct, n, p, convention
        )
    return (out, sums) if screen else out


def _classwise_logits(logits, labels, where, *static):
    """The class-wise error of logits, the softmax inside the compiled call."""
    return _classwise_core(_inputs.softmax(logits), labels, where, *static)


def _run(probs, labels, where, num_bins, binning, convention, p, mode, from_logits):
    conv = _conventions.get_convention(convention)
    m = _checks.check_num_bins(num_bins)
    _checks.check_choice("binning", binning, BINNINGS)
    if binning == "equal_mass":
        _adaptive.check_equal_mass(conv)
    name = "classwise_ece" if mode == "classwise" else "marginal_ece"
    logits = _inputs.logits_input(
        probs, labels, where, from_logits=from_logits, metric=name
    )
    if logits is not None:
        return _inputs.evaluate(
            _classwise_logits, _inputs.LOGITS, *logits, m, binning, conv, p, mode
        )
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(
        _classwise_core, probs, labels, where, m, binning, conv, p, mode, screened=True
    )


def classwise_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    p: float = 1,
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Class-wise ECE: the class average of per-class binned errors.

    Def. A.1 (Eq. (18)) of [1]: every probability :math:`p_{ic}` is binned
    in the histogram of class :math:`c` and compared with the outcome
    :math:`[y_i = c]`,

    .. math::

        \widehat{\mathrm{cwECE}}_B = \frac{1}{K}\sum_{c=1}^{K}\frac{1}{N}
        \sum_{b} n_{c,b}\,|\mathrm{acc}_{c,b} - \mathrm{conf}_{c,b}|,

    with :math:`N` the number of samples (the same for every class). ``p=2``
    gives the l2 version of Def. 3.7 of [1]; ``convention.l2_root`` chooses
    the root of the class mean (``'after_mean'``, Def. 3.7) or the mean of
    per-class roots (``'per_class'``). Equal-width statistics are
    :class:`BinnedStats` with ``classwise=True`` (mergeable).

    Args:
      probs: float ``[N, K]`` rows on the probability simplex, or ``[N, K]``
        logits with ``from_logits`` (not top-label rows: this metric needs
        every class).
      labels: int ``[N]`` class ids in ``[0, K)``.
      num_bins: static int ``M >= 1`` (per class).
      binning: ``'equal_width'`` or ``'equal_mass'``.
      p: 1 or 2.
      convention: preset name or :class:`~calib_jax.metrics.Convention`.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. 3.7 and Def. A.1 (Eq. (18)).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.classwise_ece(probs, labels, num_bins=5)):.3f}")
      0.300
    """
    p = _validate.check_p(p)
    return _run(
        probs, labels, where, num_bins, binning, convention, p, "classwise", from_logits
    )


def marginal_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_mass",
    p: float = 2,
    debias: bool = False,
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Marginal calibration error of Kumar et al. (2019), l2 by default.

    .. math::

        \mathrm{MCE}_p = \Big(\frac{1}{K}\sum_{c=1}^{K}\sum_b \frac{n_{c,b}}{N}
        |\mathrm{acc}_{c,b} - \mathrm{conf}_{c,b}|^p\Big)^{1/p},

    the marginal calibration error of [1], estimated with ``num_bins``
    equal-mass bins per class (the ``'rank'`` rule partitions the sorted
    probabilities as ``np.array_split``, as [1]'s library does). The root is
    taken after the class mean. With ``debias=True`` (``p=2`` only) each
    class's squared error is the debiased estimate of [1], clamped
    at 0, before the mean.

    Args and Returns as :func:`classwise_ece` (``binning`` defaults to
    ``'equal_mass'``), and ``debias``: static bool, the debiased l2 estimate.

    References:
      [1] A. Kumar, P. Liang, T. Ma, "Verified Uncertainty Calibration",
      NeurIPS 2019 (marginal calibration error; debiased l2 estimator).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.marginal_ece(probs, labels, num_bins=2)):.3f}")
      0.250
    """
    p = _validate.check_p(p)
    if debias and p != 2:
        raise ValueError("debias=True needs p=2 (the debiased estimate is l2).")
    mode = "debiased" if debias else "marginal"
    return _run(
        probs, labels, where, num_bins, binning, convention, p, mode, from_logits
    )


def _debiased_rows(conf, correct, where, num_bins, binning, convention):
    valid = _common.mask_or_ones(where, conf.shape[0])
    if binning == "equal_width":
        bins = _conventions.bin_index(conf, num_bins, convention)
        slots = _conventions.num_slots(convention, num_bins)
        count, sum_conf, sum_correct = _kernels.accumulate_top_label(
            conf, correct, bins, valid, slots
        )
        n = jnp.sum(valid.astype(jnp.int32))
    else:
        count, sum_conf, sum_correct, n, _, _ = _adaptive.equal_mass_stats(
            conf, correct, valid, num_bins, convention.equal_mass
        )
    square = _debiased_square(count, sum_conf, sum_correct, n)
    return jnp.sqrt(jnp.maximum(square, 0.0))


_debiased_core = jax.jit(_inputs.on_probs(_debiased_rows), static_argnums=(3, 4, 5))
_debiased_rows_core = jax.jit(_debiased_rows, static_argnums=(3, 4, 5))


def debiased_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_mass",
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Debiased top-label l2 calibration error (Kumar et al. 2019).

    .. math::

        \widehat{\mathrm{CE}}^2 = \sum_{b:\,n_b \ge 2} \frac{n_b}{N}\Big[
        (\mathrm{conf}_b - \mathrm{acc}_b)^2 - \frac{\mathrm{acc}_b
        (1 - \mathrm{acc}_b)}{n_b - 1}\Big],
        \qquad \mathrm{result} = \sqrt{\max(\widehat{\mathrm{CE}}^2, 0)} .

    Subtracting the binomial variance of each bin's accuracy removes the
    upward bias of the plug-in squared error ([1]); bins with one
    sample contribute nothing.

    Args and Returns as :func:`~calib_jax.metrics.ece` (no ``p``;
    ``binning`` defaults to ``'equal_mass'``, as [1]).

    References:
      [1] A. Kumar, P. Liang, T. Ma, "Verified Uncertainty Calibration",
      NeurIPS 2019 (debiased l2 estimator).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.debiased_ece(probs, labels, num_bins=2)):.3f}")
      0.000
    """
    conv = _conventions.get_convention(convention)
    m = _checks.check_num_bins(num_bins)
    _checks.check_choice("binning", binning, BINNINGS)
    if binning == "equal_mass":
        _adaptive.check_equal_mass(conv)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="debiased_ece"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _debiased_rows_core(conf, correct, where, m, binning, conv)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _debiased_core(probs, labels, where, m, binning, conv)
