r"""Multiclass-to-binary reductions shared by histogram binning and isotonic
regression, and an exact grouped order-statistic select.

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

from calib_jax.posthoc import _validate

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


# ---------------------------------------------------------------------------
# Exact order statistics per group (radix select, no sort)
# ---------------------------------------------------------------------------


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


def _widths(num_slots: int, key_bits: int = 32) -> tuple[int, ...]:
    # Wide digits keep the passes few; with many (group, rank) slots narrow
    # digits keep the per-slot histograms small.
    if key_bits == 32:
        return (11, 11, 10) if num_slots <= 1024 else (8, 8, 8, 8)
    widest = 13 if num_slots <= 256 else 11 if num_slots <= 1024 else 8
    passes = -(-key_bits // widest)
    base, extra = divmod(key_bits, passes)
    return tuple(base + (i < extra) for i in range(passes))


def grouped_order_statistics(
    bits: jax.Array,
    group: jax.Array,
    ranks,
    *,
    num_groups: int | None = None,
    key_bits: int = 32,
):
    """The ``ranks[g, r]``-th smallest ``bits`` among the rows of group ``g``.

    A most-significant-digit-first radix select, as
    :func:`calib_jax.metrics._order_statistics.order_statistics`, for ``G`` groups at
    once: every pass histograms one digit of each row into the slot of its
    group and the wanted ranks whose higher digits it matches (ranks sharing
    those digits share a slot), then picks each rank's digit from the
    cumulative counts. Each pass is one scatter-add and one gather over the
    rows; exact for any keys, ties included.

    Args:
      bits: uint32 ``[M]`` keys (non-negative float32 bit patterns order like
        the floats).
      group: int32 ``[M]`` group of each row in ``[0, G]``; ``G`` excludes
        the row.
      ranks: int32 ``[G, R]``, ascending along ``R``, each in ``[0, n_g)``
        (``n_g`` the group's size; anything for an empty group); or a
        function of the group sizes ``n`` (int32 ``[G]``) returning them, which
        the first pass's histogram gives without another pass over the rows.
      num_groups: static ``G``; needed when ``ranks`` is a function.
      key_bits: static; every key is below ``2**key_bits`` (fewer bits, fewer
        passes).

    Returns:
      ``(values, count_le, sizes)``: uint32 ``[G, R]`` order statistics, int32
      ``[G, R]`` numbers of the group's rows ``<=`` each of them, and the
      int32 ``[G]`` group sizes.
    """
    if callable(ranks):
        g_count, rank_fn = num_groups, ranks
        r_count = jax.eval_shape(
            rank_fn, jax.ShapeDtypeStruct((g_count,), jnp.int32)
        ).shape[1]
    else:
        g_count, r_count = ranks.shape
        rank_fn = None
    slots = g_count * r_count
    m = bits.shape[0]
    ones = jnp.ones((m,), jnp.int32)
    rank_group = jnp.arange(g_count, dtype=jnp.int32)[:, None]
    prefix = jnp.zeros((g_count, r_count), jnp.uint32)
    sizes = None
    widths = _widths(slots, key_bits)
    shift = key_bits
    row_slot = None  # slot of each row after the previous pass (slots = none)
    rank_slot = None  # slot of each rank after the previous pass
    for i, width in enumerate(widths):
        shift -= width
        size = 1 << width
        digit = ((bits >> shift) & (size - 1)).astype(jnp.int32)
        if i == 0:
            seg = jnp.where(group < g_count, group * size + digit, g_count * size)
            hist = jax.ops.segment_sum(ones, seg, g_count * size + 1)
            hist = hist[: g_count * size].reshape(g_count, size)
            sizes = jnp.sum(hist, axis=1)
            if rank_fn is not None:
                ranks = rank_fn(sizes)
            local = ranks.astype(jnp.int32)
            counts = jnp.broadcast_to(hist[:, None, :], (g_count, r_count, size))
        else:
            seg = jnp.where(row_slot < slots, row_slot * size + digit, slots * size)
            hist = jax.ops.segment_sum(ones, seg, slots * size + 1)
            hist = hist[: slots * size].reshape(slots, size)
            counts = hist[rank_slot]
        cum = jnp.cumsum(counts, axis=-1)
        chosen = jnp.sum((cum <= local[..., None]).astype(jnp.int32), axis=-1)
        chosen = jnp.minimum(chosen, size - 1)
        at_cum, at_count = (
            jnp.take_along_axis(a, chosen[..., None], axis=-1)[..., 0]
            for a in (cum, counts)
        )
        local = local - (at_cum - at_count)
        prefix = (prefix << width) | chosen.astype(jnp.uint32)
        if i == len(widths) - 1:
            # ``local`` is now the rank among the rows equal to the value, and
            # the chosen digit's count is the number of those rows.
            count_le = ranks.astype(jnp.int32) - local + at_count
            break
        # Ranks ascend, so equal prefixes are adjacent: a rank's slot is its
        # group's first rank with the same prefix.
        first = jax.vmap(lambda p: jnp.searchsorted(p, p, side="left"))(prefix)
        new_slot = (rank_group * r_count + first).astype(jnp.int32)
        if i == 0:
            parent = rank_group * size + chosen
            table = jnp.full((g_count * size,), slots, jnp.int32)
            row_in = group < g_count
            row_parent = group * size + digit
        else:
            parent = rank_slot * size + chosen
            table = jnp.full((slots * size,), slots, jnp.int32)
            row_in = row_slot < slots
            row_parent = row_slot * size + digit
        table = table.at[parent.reshape(-1)].set(new_slot.reshape(-1))
        # A row already out of every slot stays out: it is masked, not given
        # an index (a negative one would wrap to the table's last entry).
        row_slot = jnp.where(row_in, table[jnp.where(row_in, row_parent, 0)], slots)
        rank_slot = new_slot
    return prefix, count_le, sizes


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
