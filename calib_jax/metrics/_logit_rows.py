r"""Per-row reductions of ``[N, K]`` logits (row maximum, :math:`s = \sum_k
e^{z_k - m}`, the label's logit, Brier row, finiteness) without a float32 softmax of
the whole array; traceable, unchecked (:mod:`calib_jax.metrics._inputs` checks)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.metrics import _common

# Entries of a block of rows on the CPU, where XLA writes a float32 copy of an
# upcast [N, K] operand that several row reductions share; elsewhere XLA fuses.
_BLOCK_ELEMENTS = 1 << 20


def by_row_blocks(fn, x, labels):
    """``fn(x, labels)`` (row-wise, a pytree of ``[N]``) over blocks of rows on
    the CPU, whole elsewhere; over ``gcd(N, jax.device_count())`` contiguous
    chains (vmapped), so rows sharded over devices stay where they are."""
    n, k = x.shape
    chains = math.gcd(n, jax.device_count())
    rows = n // chains
    # The chains' blocks are processed side by side: 2**20 entries in all.
    block = max(1, _BLOCK_ELEMENTS // (k * chains))
    if rows <= block:
        return fn(x, labels)
    full = rows // block

    dtype = x.dtype
    # bf16/fp16 blocks are sliced as their bits: XLA:CPU upcasts the whole
    # operand of a 16-bit float slice in the loop (a float32 copy of x).
    bits = jnp.uint16 if dtype.itemsize == 2 else None

    def chain(x, labels):
        source = x if bits is None else lax.bitcast_convert_type(x, bits)

        def one(i):
            start = i * block
            xb = lax.dynamic_slice_in_dim(source, start, block)
            if bits is not None:
                xb = lax.bitcast_convert_type(xb, dtype)
            return fn(xb, lax.dynamic_slice_in_dim(labels, start, block))

        out = lax.map(one, jnp.arange(full, dtype=jnp.int32))
        out = jax.tree.map(lambda a: a.reshape((full * block,)), out)
        if full * block == rows:
            return out
        rest = fn(x[full * block :], labels[full * block :])
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, rest)

    def blocked(x, labels):
        if chains == 1:
            return chain(x, labels)
        out = jax.vmap(chain)(x.reshape(chains, rows, k), labels.reshape(chains, rows))
        return jax.tree.map(lambda a: a.reshape((n,)), out)

    return lax.platform_dependent(x, labels, cpu=blocked, default=fn)


def _reductions(logits, labels):
    z = _common.as_float(logits)
    k = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    y = labels.astype(jnp.int32)[:, None]
    m = jnp.max(z, axis=1)
    s = jnp.sum(jnp.exp(z - m[:, None]), axis=1)
    z_y = jnp.sum(jnp.where(k == y, z, 0.0), axis=1)
    before = jnp.max(jnp.where(k < y, z, -jnp.inf), axis=1)
    return m, s, z_y, before


def logit_reductions(logits, labels):
    """``(m, s, z_y, before)`` per row, float32 ``[N]`` each: the row maximum,
    ``sum_k exp(z_k - m)``, the label's logit and the largest logit of a class
    before the label (``-inf`` for label 0)."""
    return by_row_blocks(_reductions, logits, labels.astype(jnp.int32))


def label_log_prob(logits, labels):
    r""":math:`\log p_{iy_i} = (z_{iy_i} - m_i) - \log s_i`, float32 ``[N]``."""
    m, s, z_y, _ = logit_reductions(logits, labels)
    return (z_y - m) - jnp.log(s)


def _exp_sums(logits, labels):
    """``(z, k, y, m, e, s, sq)``: float32 logits, class ids, labels ``[n, 1]``,
    row maximum, ``e^{z - m}``, its row sum and row sum of squares."""
    z = _common.as_float(logits)
    k = lax.broadcasted_iota(jnp.int32, z.shape, 1)
    y = labels[:, None]
    m = jnp.max(z, axis=1)
    e = jnp.exp(z - m[:, None])
    return z, k, y, m, e, jnp.sum(e, axis=1), jnp.sum(e * e, axis=1)


def _brier_of(sq, s, e_y):
    return sq / (s * s) - 2.0 * (e_y / s) + 1.0


def _brier(logits, labels):
    _, k, y, _, e, s, sq = _exp_sums(logits, labels)
    return _brier_of(sq, s, jnp.sum(jnp.where(k == y, e, 0.0), axis=1))


def brier_rows(logits, labels):
    r"""Per-row Brier score from logits, float32 ``[N]``:
    :math:`\sum_k e^{2(z_k - m)} / s^2 - 2 e^{z_y - m} / s + 1` (row
    reductions, over blocks of rows on the CPU)."""
    return by_row_blocks(_brier, logits, labels.astype(jnp.int32))


def finite_rows(logits, labels):
    return jnp.all(jnp.isfinite(logits), axis=1)


def _fused(logits, labels):
    z, k, y, m, _, s, sq = _exp_sums(logits, labels)
    # The label's logit itself (the one nonzero term of _reductions' sum).
    z_y = jnp.take_along_axis(z, y, axis=1)[:, 0]
    before = jnp.max(jnp.where(k < y, z, -jnp.inf), axis=1)
    # 0 * z is NaN for NaN and +-inf only: the row sum is 0 iff every logit
    # is finite (one multiply-add in this loop; isfinite costs a loop of its
    # own on XLA:CPU).
    zeros = jnp.sum(z * 0.0, axis=1)
    # _brier's row, its label term from the label's logit.
    brier = _brier_of(sq, s, jnp.exp(z_y - m))
    return m, s, z_y, before, brier, zeros == 0.0


def fused_rows(logits, labels):
    r"""``(conf, correct, log_p, brier, finite)`` per row from one pass (one row
    maximum, one exponential per logit). ``conf`` and ``correct`` are the bits
    of ``_inputs.rows_from_logits`` (the same separate reductions); ``brier``
    equals :func:`brier_rows` up to float32 summation order."""
    m, s, z_y, before, brier, finite = by_row_blocks(
        _fused, logits, labels.astype(jnp.int32)
    )
    log_p = (z_y - m) - jnp.log(s)
    return 1.0 / s, (z_y == m) & (before < m), log_p, brier, finite
