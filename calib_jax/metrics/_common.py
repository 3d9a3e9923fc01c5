r"""Shared pieces of the metric cores: top-label extraction and binned errors.

Everything here is jittable and does no value checks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels

# The top label is found with one max-reduction over packed uint32 keys in
# rows of at most this many classes (XLA:CPU vectorises those well); wider
# rows are viewed as [N * K / g, g] blocks with g the largest divisor of K in
# [_MIN_GROUP, _MAX_GROUP], then the block maxima are reduced.
_MAX_GROUP = 32
_MIN_GROUP = 8


def as_float(x: jax.Array) -> jax.Array:
    """Upcasts bf16/fp16 to float32 (float64 stays float64)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _group_size(k: int) -> int | None:
    if k <= _MAX_GROUP:
        return k
    for g in range(_MAX_GROUP, _MIN_GROUP - 1, -1):
        if k % g == 0:
            return g
    return None


def _packed_keys(probs, labels, offset):
    """``4 * bits(p) + 2 * [k < y] + [k == y]`` as uint32 ``[N, K]``."""
    bits = lax.bitcast_convert_type(probs, jnp.uint32)
    k = lax.broadcasted_iota(jnp.int32, probs.shape, 1)
    if offset is not None:
        k = k + offset[:, None]
    y = labels[:, None]
    flags = 2 * (k < y).astype(jnp.uint32) + (k == y).astype(jnp.uint32)
    return bits * 4 + flags


def _packed_max(probs, labels, offset, screen=False):
    """Row max of ``4 * bits(p) + 2 * [k < y] + [k == y]`` as uint32, and with
    ``screen`` the row sums of :func:`screen_values` from the same reduction."""
    key = _packed_keys(probs, labels, offset)
    if not screen:
        return jnp.max(key, axis=1)
    zero_key, zero = jnp.zeros((), jnp.uint32), jnp.zeros((), probs.dtype)
    return lax.reduce(
        (key, screen_values(probs)),
        (zero_key, zero),
        lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]),
        (1,),
    )


def screen_values(probs: jax.Array) -> jax.Array:
    """``p`` where ``p >= 0``; a negative ``p`` becomes ``p + 2|p| * 2**(e-1)``
    (``2**(e-1)`` the largest power of two of the dtype), NaN stays NaN and
    ``+inf`` becomes NaN.

    A row of probabilities keeps its sum; a row with a NaN/inf or a negative
    entry (down to about ``2**-137`` in float32) gets a sum far from 1. Plain
    arithmetic, no select: it fuses into a row reduction on XLA:CPU where a
    ``jnp.where`` does not vectorise.
    """
    big = jnp.asarray(2.0 ** (jnp.finfo(probs.dtype).maxexp - 1), probs.dtype)
    return probs + (jnp.abs(probs) - probs) * big


def top_label(probs: jax.Array, labels: jax.Array, *, screen: bool = False):
    r"""Top-label confidence and correctness in one pass over ``probs``.

    .. math::

        c_i = \max_k p_{ik}, \qquad a_i = [\,\hat y_i = y_i\,],\quad
        \hat y_i = \min\{k : p_{ik} = c_i\},

    i.e. the prediction is ``argmax`` with ties going to the first class, as
    in NumPy, PyTorch and TensorFlow.

    For float32 both come from one max-reduction over the uint32 keys
    ``4 * bits(p_ik) + 2 * [k < y_i] + [k = y_i]``. For ``0 <= p < 2`` the bit
    pattern is monotone in ``p`` and ``4 * bits`` fits in 32 bits, so the
    largest key holds :math:`c_i` (``key >> 2``); among entries equal to
    :math:`c_i` it is the one with the largest flag, which is 1 exactly when
    the label is the first maximal class. Rows wider than 32 classes are
    reduced in blocks of a divisor of K (fast path); other widths and
    float64 use ``jnp.argmax``.

    Args:
      probs: float ``[N, K]`` with entries in [0, 1].
      labels: int ``[N]``.
      screen: also return the row sums of :func:`screen_values` (the value
        screen of the metrics' input check), from the same reduction.

    Returns:
      ``(conf, correct)``: float ``[N]`` and bool ``[N]``; with ``screen``
      ``(conf, correct, sums)``.

    Kernel families ``'metric_top_label'`` (``K <= 32``) and
    ``'metric_top_label_blocks'`` (wider rows) of :mod:`calib_jax.kernels`: the
    plain formulation is :func:`top_label_plain`; float64 reference
    ``tests/_reference_metrics.py``.
    """
    probs = as_float(probs)
    labels = labels.astype(jnp.int32)
    k = probs.shape[1]
    group = _group_size(k) if probs.dtype == jnp.float32 else None
    plain = functools.partial(top_label_plain, screen=screen)
    if group is None:
        return plain(probs, labels)
    # Two families: rows of at most 32 classes reduce directly, wider rows are
    # viewed as blocks of a divisor of K (a different memory layout).
    family = "metric_top_label" if group == k else "metric_top_label_blocks"
    return kernels.select(
        family,
        functools.partial(_top_label_packed, group=group, screen=screen),
        plain,
        probs,
        labels,
    )


def top_label_plain(probs: jax.Array, labels: jax.Array, *, screen: bool = False):
    """Plain formulation of :func:`top_label`: ``jnp.max`` and ``jnp.argmax``."""
    conf = jnp.max(probs, axis=1)
    out = (conf, jnp.argmax(probs, axis=1).astype(jnp.int32) == labels)
    if screen:
        out = (*out, jnp.sum(screen_values(probs), axis=1))
    return out


def _top_label_packed(probs, labels, *, group, screen=False):
    """The packed-key reduction of :func:`top_label` (float32, ``group | K``)."""
    n, k = probs.shape
    if group == k:
        key = _packed_max(probs, labels, None, screen)
    else:
        blocks = k // group
        sub = probs.reshape(n * blocks, group)
        # Broadcasts (not repeat/tile) so XLA fuses them into the reduction.
        shape = (n, blocks)
        offset = jnp.broadcast_to(jnp.arange(blocks, dtype=jnp.int32) * group, shape)
        sub_labels = jnp.broadcast_to(labels[:, None], shape)
        key = _packed_max(sub, sub_labels.reshape(-1), offset.reshape(-1), screen)
        if screen:
            key = (key[0].reshape(shape), jnp.sum(key[1].reshape(shape), axis=1))
            key = (jnp.max(key[0], axis=1), key[1])
        else:
            key = jnp.max(key.reshape(shape), axis=1)
    if screen:
        key, sums = key
    conf = lax.bitcast_convert_type(key >> 2, jnp.float32)
    out = (conf, (key & 3) == 1)
    return (*out, sums) if screen else out


def sort_key(conf: jax.Array, flag: jax.Array, valid: jax.Array) -> jax.Array:
    """int32 keys ``2 * bits(conf) + flag`` that sort like ``conf`` (then flag).

    For ``0 <= conf < 2`` the float32 bit pattern is monotone and the key fits
    in int32; excluded rows get the largest key (one int32 array to sort, no
    payload; timings in ``benchmarks/RESULTS.md``). Kernel family
    ``'sort_keys'``; plain formulation :func:`sorted_by_confidence_plain`.
    """
    bits = lax.bitcast_convert_type(conf.astype(jnp.float32) + 0.0, jnp.int32)
    key = bits * 2 + flag.astype(jnp.int32)
    return jnp.where(valid, key, jnp.iinfo(jnp.int32).max)


def unpack_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Inverse of :func:`sort_key`: ``(conf, flag)``."""
    return lax.bitcast_convert_type(key >> 1, jnp.float32), key & 1


def sorted_by_confidence(
    conf: jax.Array, flag: jax.Array, valid: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(conf, flag)`` sorted by confidence, then flag; excluded rows last.

    Args:
      conf: float ``[N]`` confidences in [0, 1].
      flag: bool ``[N]``.
      valid: bool ``[N]`` included rows.

    Returns:
      float32 ``[N]`` sorted confidences (``-0.0`` read as ``0.0``; the values
      of the excluded rows at the end are unspecified) and int32 ``[N]`` flags.

    Kernel family ``'sort_keys'`` (:mod:`calib_jax.kernels`): one sort of the
    packed int32 keys of :func:`sort_key`; the plain formulation is
    :func:`sorted_by_confidence_plain`; float64 reference
    ``equal_mass_members`` in ``tests/_reference_metrics.py`` (``np.argsort``).
    """
    return kernels.select(
        "sort_keys", _sorted_packed, sorted_by_confidence_plain, conf, flag, valid
    )


def _sorted_packed(conf, flag, valid):
    return unpack_key(jnp.sort(sort_key(conf, flag, valid)))


def sorted_by_confidence_plain(conf, flag, valid):
    """Plain :func:`sorted_by_confidence`: ``lax.sort`` of (float key, flag)."""
    c = jnp.where(valid, conf.astype(jnp.float32) + 0.0, jnp.inf)
    f = jnp.where(valid, flag.astype(jnp.int32), 1)
    return lax.sort((c, f), num_keys=2)


def sortable_int(x: jax.Array) -> jax.Array:
    """int32 keys ordered like the (non-NaN) float32 values ``x``.

    Kernel family ``'sort_keys'`` (OOD metrics); the plain formulations sort
    the floats (``_ood._ranks_plain``, ``_ood._accepted_plain``); float64
    references ``ood_auroc``/``ood_aupr`` in ``tests/_reference_metrics.py``.
    """
    bits = lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def label_prob(probs: jax.Array, labels: jax.Array) -> jax.Array:
    """``probs[i, labels[i]]`` as float ``[N]``."""
    labels = labels.astype(jnp.int32)
    return jnp.take_along_axis(as_float(probs), labels[:, None], axis=1)[:, 0]


def mask_or_ones(where: jax.Array | None, n: int) -> jax.Array:
    """The bool ``[N]`` mask of included rows (all True for None)."""
    if where is None:
        return jnp.ones((n,), bool)
    return jnp.asarray(where, bool)


def binned_error(
    count: jax.Array,
    sum_conf: jax.Array,
    sum_correct: jax.Array,
    total: jax.Array,
    *,
    p: float,
    min_count: int = 1,
) -> jax.Array:
    r"""Calibration error from per-bin sums, reduced over the last axis.

    .. math::

        \mathrm{CE}_1 = \sum_b \frac{|S^c_b - S^a_b|}{N},\quad
        \mathrm{CE}_2 = \Big(\sum_b \frac{(S^c_b - S^a_b)^2}{n_b N}\Big)^{1/2},
        \quad
        \mathrm{CE}_\infty = \max_b \frac{|S^c_b - S^a_b|}{n_b},

    with :math:`S^c_b, S^a_b` the sums of confidences and of correct
    indicators in bin :math:`b`, i.e. :math:`\frac{n_b}{N}|\mathrm{acc}_b -
    \mathrm{conf}_b|` summed. Bins with fewer than ``min_count`` samples
    contribute nothing (empty bins never give NaN).

    Args:
      count, sum_conf, sum_correct: ``[..., S]`` per-bin statistics.
      total: number of samples ``N`` (scalar or broadcastable to ``[...]``).
      p: 1, 2 or ``inf``.
      min_count: static int, bins below it are skipped.

    Returns:
      float32 ``[...]`` (for ``p = 2`` after the square root).
    """
    count = count.astype(jnp.float32)
    gap = sum_conf.astype(jnp.float32) - sum_correct.astype(jnp.float32)
    keep = count >= max(int(min_count), 1)
    safe_count = jnp.where(keep, count, 1.0)
    denom = jnp.maximum(jnp.asarray(total, jnp.float32), 1.0)
    if p == 1:
        return jnp.sum(jnp.where(keep, jnp.abs(gap), 0.0), axis=-1) / denom
    if p == 2:
        return jnp.sqrt(squared_error(count, gap, keep, denom))
    if p == float("inf"):
        return jnp.max(jnp.where(keep, jnp.abs(gap) / safe_count, 0.0), axis=-1)
    raise ValueError(f"p must be 1, 2 or inf, got {p!r}.")


def squared_error(count, gap, keep, denom) -> jax.Array:
    """``sum_b (n_b / N) (acc_b - conf_b)^2`` over the last axis (no root)."""
    safe_count = jnp.where(keep, count, 1.0)
    return jnp.sum(jnp.where(keep, gap * gap / safe_count, 0.0), axis=-1) / denom
