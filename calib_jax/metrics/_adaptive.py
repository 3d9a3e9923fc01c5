r"""Equal-mass (adaptive) binning and the top-label adaptive ECE: sort-based,
so not mergeable across batches (collect the split, call once)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import _checks, kernels
from calib_jax.metrics import (
    _common,
    _conventions,
    _cpu_kernels,
    _inputs,
    _validate,
)


def _first_of_tie(s: jax.Array) -> jax.Array:
    """Index of the first occurrence of ``s[r]`` in the sorted ``s``."""
    r = lax.iota(jnp.int32, s.shape[0])
    new = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    return lax.cummax(jnp.where(new, r, 0), axis=0)


def _interp_edges(s, n, num_bins, numer_scale):
    """Linear interpolation of ``s`` at positions ``j * numer_scale / M``."""
    m = num_bins
    j = jnp.arange(m + 1, dtype=jnp.int32)
    numer = j * numer_scale
    lo = jnp.minimum(numer // m, jnp.maximum(n - 1, 0))
    frac = (numer % m).astype(s.dtype) / m
    frac = jnp.where(numer // m >= n - 1, 0.0, frac)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    return s[lo], s[hi], frac


def assign_sorted(s: jax.Array, n: jax.Array, num_bins: int, rule: str) -> jax.Array:
    """Equal-mass bin of every sorted confidence (the rules:
    ``docs/metrics.md``, "Binning conventions"). ``'rank'`` keeps a tie group
    in the ``np.array_split`` group of its first member (groups emptied by
    ties stay empty); ``'digitize'`` gives 1.0 a bin ``M`` of its own.
    ``s`` float ``[N]`` ascending, +inf past the ``n`` included rows; returns
    int32 ``[N]`` bins, ``-1`` for rows in no bin.
    """
    m = num_bins
    r = lax.iota(jnp.int32, s.shape[0])
    if rule == "rank":
        first = _first_of_tie(s)
        q, rem = n // m, n % m
        big = rem * (q + 1)
        b = jnp.where(
            first < big, first // (q + 1), rem + (first - big) // jnp.maximum(q, 1)
        )
    elif rule == "interp":
        a, c, frac = _interp_edges(s, n, m, n)
        e = a + (c - a) * frac
        b = jnp.searchsorted(e, s, side="left").astype(jnp.int32) - 1
    elif rule == "quantile":
        a, c, frac = _interp_edges(s, n, m, n - 1)
        e = jnp.where(frac >= 0.5, c - (c - a) * (1.0 - frac), a + (c - a) * frac)
        e = e.at[0].set(0.0).at[m].set(1.0)
        b = jnp.searchsorted(e, s, side="right").astype(jnp.int32) - 1
        b = jnp.clip(b, 0, m - 1)
    elif rule == "digitize":
        j = jnp.arange(1, m, dtype=jnp.int32)
        # round(j n / M), half to even, in exact integer arithmetic.
        q, rem = (j * n) // m, (j * n) % m
        up = (2 * rem > m) | ((2 * rem == m) & (q % 2 == 1))
        idx = jnp.minimum(q + up.astype(jnp.int32), jnp.maximum(n - 1, 0))
        upper = jnp.concatenate([s[idx], jnp.ones((1,), s.dtype)])
        b = jnp.searchsorted(upper, s, side="right").astype(jnp.int32)
    else:
        raise ValueError(f"unknown equal-mass rule {rule!r}.")
    return jnp.where(r < n, b, -1)


def num_accumulators(num_bins: int, rule: str) -> int:
    """Bins an equal-mass rule fills: ``M``, or ``M + 1`` for ``'digitize'``."""
    return num_bins + (1 if rule == "digitize" else 0)


def equal_mass_stats(conf, correct, valid, num_bins, rule):
    """Per-bin ``(count, sum_conf, sum_correct, n, lower, upper)`` of equal-mass
    bins; ``lower``/``upper`` the bin's extreme confidences (0 when empty)."""
    n = jnp.sum(valid.astype(jnp.int32))
    s, a = _common.sorted_by_confidence(conf, correct, valid)
    s = jnp.where(lax.iota(jnp.int32, s.shape[0]) < n, s, jnp.inf)
    bins = assign_sorted(s, n, num_bins, rule)
    slots = num_accumulators(num_bins, rule)
    count = jax.ops.segment_sum(jnp.ones_like(a), bins, slots)
    sum_conf = jax.ops.segment_sum(jnp.where(bins >= 0, s, 0.0), bins, slots)
    sum_correct = jax.ops.segment_sum(a, bins, slots)
    lower = jax.ops.segment_min(s, bins, slots)
    upper = jax.ops.segment_max(jnp.where(bins >= 0, s, -jnp.inf), bins, slots)
    empty = count == 0
    lower = jnp.where(empty, 0.0, lower)
    upper = jnp.where(empty, 0.0, upper)
    return count, sum_conf, sum_correct, n, lower, upper


def check_equal_mass(convention: _conventions.Convention) -> str:
    """The convention's equal-mass rule; ValueError when the preset has none."""
    if convention.equal_mass is None:
        raise ValueError(
            f"convention {convention.name!r} ({convention.library}) has no "
            "equal-mass binning; use binning='equal_width' or another preset."
        )
    return convention.equal_mass


# Rows from which the 'rank' rule uses radix select instead of a sort.
SELECT_MIN_ROWS = 1 << 15


@kernels.dispatch("metric_radix_select", _cpu_kernels.rank_stats)
def rank_stats(conf, correct, valid, *, num_bins):
    """``(count, sum_conf, sum_correct, n)`` of the ``'rank'`` bins: sort,
    then cut (:func:`assign_sorted`)."""
    count, sum_conf, sum_correct, n, _, _ = equal_mass_stats(
        conf, correct, valid, num_bins, "rank"
    )
    return count, sum_conf.astype(jnp.float32), sum_correct, n


def equal_mass_rows_error(conf, correct, valid, num_bins, convention, p):
    """Top-label binned error of rows ``(conf, correct)`` with the
    convention's equal-mass bins (traceable)."""
    if convention.equal_mass == "rank" and conf.shape[0] >= SELECT_MIN_ROWS:
        count, sum_conf, sum_correct, n = rank_stats(
            conf, correct, valid, num_bins=num_bins
        )
    else:
        count, sum_conf, sum_correct, n, _, _ = equal_mass_stats(
            conf, correct, valid, num_bins, convention.equal_mass
        )
    return _common.binned_error(
        count, sum_conf, sum_correct, n, p=p, min_count=convention.min_count
    )


def equal_mass_error(probs, labels, where, num_bins, convention, p, screen=False):
    """:func:`equal_mass_rows_error` of the top-label rows of ``probs``; with
    ``screen`` ``(error, sums)``, the value screen's row sums too."""
    if screen:
        conf, correct, sums = _common.top_label(probs, labels, screen=True)
    else:
        conf, correct = _common.top_label(probs, labels)
    valid = _common.mask_or_ones(where, conf.shape[0])
    out = equal_mass_rows_error(conf, correct, valid, num_bins, convention, p)
    return (out, sums) if screen else out


_adaptive_core = jax.jit(equal_mass_error, static_argnums=(3, 4, 5, 6))


def _adaptive_rows(conf, correct, where, num_bins, convention, p):
    valid = _common.mask_or_ones(where, conf.shape[0])
    return equal_mass_rows_error(conf, correct, valid, num_bins, convention, p)


_adaptive_rows_core = jax.jit(_adaptive_rows, static_argnums=(3, 4, 5))


def adaptive_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    p: float = 1,
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Top-label ECE with equal-mass bins (adaptive ECE; sort-based).

    .. math::

        \mathrm{ECE}^{\mathrm{em}}_p = \Big(\sum_{b=1}^{M} \frac{n_b}{N}
        |\mathrm{acc}_b - \mathrm{conf}_b|^p\Big)^{1/p},

    the binned estimator of Def. 3.6 of [1] with bins holding (nearly) equal
    numbers of top-label confidences :math:`\max_k p_{ik}`, the AdaECE of
    [2]; not the all-class ACE of [3] nor an unweighted average over bins.
    The equal-mass rule (ties, edges) follows ``convention``
    (``docs/metrics.md``, "Binning conventions").

    Args and Returns as :func:`~calib_jax.metrics.ece` (no ``binning``).

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. 3.6.
      [2] J. Mukhoti et al., "Calibrating Deep Neural Networks using Focal
      Loss", NeurIPS 2020 (AdaECE).
      [3] J. Nixon et al., "Measuring Calibration in Deep Learning", CVPR
      Workshops 2019 (adaptive calibration error).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.adaptive_ece(probs, labels, num_bins=2)):.3f}")
      0.150
    """
    conv = _conventions.get_convention(convention)
    m = _checks.check_num_bins(num_bins)
    p = _validate.check_p(p)
    check_equal_mass(conv)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="adaptive_ece"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _adaptive_rows_core(conf, correct, where, m, conv, p)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(
        _adaptive_core, probs, labels, where, m, conv, p, screened=True
    )
