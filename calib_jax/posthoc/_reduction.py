r"""Multiclass-to-binary reductions shared by histogram binning and isotonic
regression, and exact per-group order statistics (sort and cut).

A *binary* calibrator maps a score :math:`v \in [0, 1]` to a probability.
Two reductions turn one binary map per class into a multiclass calibrator
(Gupta & Ramdas 2022, Sec. 2 and 4):

``'top_label'``
  For each class :math:`l`, one binary map :math:`f_l` is fitted on the
  validation rows *predicted* as :math:`l` (first arg-max of the logits), with
  score the top-label confidence :math:`c = \max_k p_k` and target
  :math:`1[y = l]` (the prediction is correct). At test time the confidence
  of the predicted class :math:`l` becomes :math:`c' = f_l(c)` and the other
  classes share the remaining mass :math:`1 - c'` in proportion to their
  uncalibrated probabilities,

  .. math::

      p'_l = c', \qquad p'_k = (1 - c')\,\frac{p_k}{1 - c} \quad (k \ne l),

  so every row stays on the simplex. The calibrated confidence of the
  predicted class is what top-label calibration is about; the argmax of
  :math:`p'` is the original prediction whenever :math:`c' \ge (1 - c')
  \max_{k \ne l} p_k / (1 - c)`, and may move otherwise (e.g. when
  :math:`c' < 1/K`). A class never predicted on the validation set keeps its
  uncalibrated confidence.
``'one_vs_rest'``
  For each class :math:`k`, one binary map :math:`f_k` is fitted on all
  rows, with score :math:`p_k` and target :math:`1[y = k]` (Zadrozny &
  Elkan 2002). At test time :math:`q_k = f_k(p_k)` and the row is
  normalised, :math:`p'_k = q_k / \sum_j q_j` (uniform if every :math:`q_k`
  is 0).

Calibrators built on these return log-probabilities :math:`\log p'` (valid
calibrated logits: ``softmax`` gives :math:`p'` back). A zero probability
gives :math:`-\infty`, as the map intends.

References:
  [1] C. Gupta, A. Ramdas, "Top-label calibration and multiclass-to-binary
  reductions", ICLR 2022, arXiv:2107.08353v3, Sec. 2 (top-label
  calibration), Sec. 4 (the reductions, Algorithms 2-3).
  [2] B. Zadrozny, C. Elkan, "Transforming Classifier Scores into Accurate
  Multiclass Probability Estimates", KDD 2002 (one-vs-rest reduction and
  normalisation).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels
from calib_jax.posthoc import _cpu_kernels, _validate

VARIANTS = ("top_label", "one_vs_rest")


# The scores are computed by these two jitted functions, both when fitting and
# when applying a map, so that equal logits of the same shape give bit-equal
# scores in both (an enclosing jit may fuse and round them differently).


@jax.jit
def probabilities(logits: jax.Array) -> jax.Array:
    """Softmax probabilities ``[N, K]`` (float32 or wider)."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return jax.nn.softmax(logits, axis=-1)


@jax.jit
def top_label(logits: jax.Array):
    """``(pred [N], conf [N])``: the first arg-max (the library's correctness
    rule) and the top-label confidence :math:`1 / \\sum_k e^{z_k - \\max z}`,
    without the ``[N, K]`` probabilities."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    m = jnp.max(logits, axis=-1, keepdims=True)
    pred = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return pred, 1.0 / jnp.sum(jnp.exp(logits - m), axis=-1)


@jax.jit
def checked_top_label(logits: jax.Array, labels: jax.Array, where):
    """``(top_label(logits), value_summary)``: a fitter's scores and its input
    check from one read of the logits (the scores bit-equal to
    :func:`top_label`'s, which applying a map computes)."""
    return top_label(logits), _validate.value_summary(logits, labels, where)


@jax.jit
def checked_probabilities(logits: jax.Array, labels: jax.Array, where):
    """``(probabilities(logits), value_summary)`` from one read of the
    logits (the probabilities bit-equal to :func:`probabilities`'s)."""
    return probabilities(logits), _validate.value_summary(logits, labels, where)


def top_label_output(logp: jax.Array, pred: jax.Array, conf: jax.Array):
    """Log-probabilities with the predicted class's confidence set to ``conf``.

    Args:
      logp: float ``[N, K]`` uncalibrated log-probabilities.
      pred: int ``[N]`` predicted classes.
      conf: float ``[N]`` calibrated confidences in ``[0, 1]``.

    Returns:
      float ``[N, K]``: ``log conf`` at ``pred``; elsewhere the remaining mass
      ``1 - conf`` split in proportion to the uncalibrated probabilities
      (evenly if they are all 0 in floating point).
    """
    k = logp.shape[-1]
    hit = jnp.arange(k, dtype=jnp.int32)[None, :] == pred[:, None]
    rest = jax.nn.logsumexp(jnp.where(hit, -jnp.inf, logp), axis=-1)  # log(1 - c)
    log_c = jnp.log(conf)
    log_rest = jnp.log1p(-conf)
    finite = jnp.isfinite(rest)
    shift = jnp.where(finite, log_rest - jnp.where(finite, rest, 0.0), 0.0)
    even = log_rest - math.log(max(k - 1, 1))
    other = jnp.where(finite[:, None], logp + shift[:, None], even[:, None])
    return jnp.where(hit, log_c[:, None], other)


def one_vs_rest_output(q: jax.Array) -> jax.Array:
    """``log(q / sum(q))`` per row (zeros, i.e. uniform, where the sum is 0)."""
    total = jnp.sum(q, axis=-1, keepdims=True)
    ok = total > 0
    out = jnp.log(q) - jnp.log(jnp.where(ok, total, 1.0))
    return jnp.where(ok, out, jnp.zeros_like(out))


def apply_top_label(binary_map, params, logits: jax.Array) -> jax.Array:
    """Top-label calibrated log-probabilities from a per-class ``binary_map``.

    ``binary_map(params, scores, classes)`` maps each row's top-label
    confidence (with its predicted class) to a calibrated one, which
    :func:`top_label_output` puts back on the simplex.
    """
    pred, conf = top_label(logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return top_label_output(logp, pred, binary_map(params, conf, pred))


def apply_one_vs_rest(binary_map, params, logits: jax.Array) -> jax.Array:
    """One-vs-rest calibrated log-probabilities from a per-class ``binary_map``
    applied to every class's probability, renormalised by
    :func:`one_vs_rest_output`."""
    n, k = logits.shape
    p = probabilities(logits)
    cls = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :], (n, k))
    return one_vs_rest_output(binary_map(params, p, cls))


@kernels.dispatch("posthoc_order_statistics", _cpu_kernels.grouped_cut)
def grouped_cut(v, group, *, num_groups: int, ranks, top_label_of: int = 0):
    """The ``ranks(n)[g, r]``-th smallest scores ``v`` of each group ``g``.

    One sort of the (group, score) pairs puts each group's scores in a
    contiguous ascending run; the order statistics are read at the run's
    start plus the ranks, and the number of the group's rows up to each from
    the end of its run of equal scores. Exact for any scores, ties included.

    Args:
      v: float ``[M]`` scores in ``[0, 1]``.
      group: int32 ``[M]`` group of each row in ``[0, G]``; ``G`` excludes
        the row.
      num_groups: static ``G``.
      ranks: static function of the group sizes (int32 ``[G]``) returning
        int32 ``[G, R]`` ranks, ascending along ``R``, each in ``[0, n_g)``.
      top_label_of: static; ``K`` when ``v`` are top-label confidences of
        ``K`` classes (at least ``fl(1/K)``), else 0 (used by the CPU kernel).

    Returns:
      ``(values, count_le, sizes)``: float32 ``[G, R]`` order statistics
      (unspecified for an empty group), int32 ``[G, R]`` numbers of the
      group's rows ``<=`` each of them, and the int32 ``[G]`` group sizes.
    """
    del top_label_of
    m = v.shape[0]
    g, s = lax.sort((group.astype(jnp.int32), v.astype(jnp.float32) + 0.0), num_keys=2)
    starts = jnp.searchsorted(g, jnp.arange(num_groups + 1, dtype=jnp.int32))
    starts = starts.astype(jnp.int32)
    sizes = starts[1:] - starts[:-1]
    idx = jnp.clip(starts[:-1, None] + ranks(sizes), 0, m - 1)
    last = jnp.concatenate([(g[1:] != g[:-1]) | (s[1:] != s[:-1]), jnp.array([True])])
    iota = jnp.arange(m, dtype=jnp.int32)
    end = lax.cummin(jnp.where(last, iota, m), reverse=True)[idx]
    count_le = jnp.where(sizes[:, None] > 0, end + 1 - starts[:-1, None], 0)
    return s[idx], count_le, sizes


def cut_ranks(sizes: jax.Array, *, num_bins: int, midpoint: bool) -> jax.Array:
    """:func:`equal_mass_ranks`, each followed by the next rank (clipped to
    the group) with ``midpoint``: ``[G, M-1]`` or ``[G, 2(M-1)]``."""
    ranks = equal_mass_ranks(sizes, num_bins)
    if not midpoint:
        return ranks
    top = jnp.maximum(sizes.astype(jnp.int32) - 1, 0)[:, None]
    pairs = jnp.stack([ranks, jnp.minimum(ranks + 1, top)], axis=-1)
    return pairs.reshape(ranks.shape[0], -1)


def equal_mass_ranks(sizes: jax.Array, num_bins: int) -> jax.Array:
    r"""Ranks of the ``M - 1`` equal-mass thresholds of each group, ``[G, M-1]``.

    Group :math:`j` of :math:`n` sorted values starts at rank :math:`R_j`
    (the first :math:`n \bmod M` groups hold one value more, as
    :func:`calib_jax.metrics.adaptive_ece`'s ``'rank'`` rule); the threshold
    between groups :math:`j - 1` and :math:`j` is the value of rank
    :math:`R_j - 1`.
    """
    n = sizes.astype(jnp.int32)[:, None]
    q, rem = n // num_bins, n % num_bins
    j = jnp.arange(1, num_bins, dtype=jnp.int32)[None, :]
    start = jnp.where(j <= rem, j * (q + 1), rem * (q + 1) + (j - rem) * q)
    return jnp.clip(start - 1, 0, jnp.maximum(n - 1, 0))


def float_bits(x: jax.Array) -> jax.Array:
    """uint32 bit patterns of float32 ``x >= 0`` (``-0.0`` becomes ``+0.0``)."""
    return lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.uint32)


def bits_float(b: jax.Array) -> jax.Array:
    """Inverse of :func:`float_bits`."""
    return lax.bitcast_convert_type(b, jnp.float32)


def segmented_searchsorted(
    table: jax.Array, row: jax.Array, v: jax.Array, *, side: str = "right"
) -> jax.Array:
    """``searchsorted(table[row[i]], v[i], side)`` for every ``i``.

    A vectorised binary search (``ceil(log2(L + 1))`` gathers) over the
    sorted rows of ``table`` ``[G, L]``; no ``[M, L]`` intermediate.
    ``side='right'`` counts the entries ``<= v``, ``'left'`` those ``< v``.

    Returns:
      int32, the shape of ``v``, in ``[0, L]``.
    """
    length = table.shape[1]
    flat = table.reshape(-1)
    base = row.astype(jnp.int32) * length
    lo = jnp.zeros(v.shape, jnp.int32)
    hi = jnp.full(v.shape, length, jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(length + 1)))):
        mid = (lo + hi) // 2
        value = flat[base + jnp.minimum(mid, length - 1)]
        below = (value <= v) if side == "right" else (value < v)
        right = (mid < hi) & below
        lo = jnp.where(right, mid + 1, lo)
        hi = jnp.where(right, hi, mid)
    return lo
