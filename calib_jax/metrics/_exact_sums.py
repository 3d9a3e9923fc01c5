r"""Exact per-slot sums of non-negative float32 values, correctly rounded once.

A float32 value :math:`x \ge 0` is an integer multiple of :math:`2^{-149}`
(the smallest subnormal): :math:`x = m \cdot 2^{e}` with a 24-bit integer
:math:`m`. The sum of such values is kept exactly as a fixed-point integer in
:data:`LIMBS` 16-bit limbs (int32, unit :math:`2^{-149}`, room for sums up to
:math:`2^{43}`), and rounded to float32 (to nearest, ties to even) only when
read. Integer addition is associative, so the rounded sum does not depend on
the order of the rows, on how they are split into batches, devices or
processes, nor on the compiler: merging two sums of limbs and rounding gives
the one-pass value bit for bit (``docs/metrics.md``, "Exact sums").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

LIMBS = 12
_BITS = 16
_MASK = (1 << _BITS) - 1
# Rows per scatter: a limb receives one piece below 2^16 per row, so 2^14
# rows and a normalized limb stay below 2^31.
ROWS = 1 << 14


def _pieces(values):
    """``(limb, pieces)`` of every value: the index of its lowest limb and
    its three 16-bit pieces there and in the next two limbs (uint32)."""
    u = lax.bitcast_convert_type(values.astype(jnp.float32), jnp.uint32)
    exponent = u >> 23
    m = (u & 0x7FFFFF) | jnp.where(exponent > 0, jnp.uint32(1 << 23), jnp.uint32(0))
    shift = jnp.maximum(exponent, 1) - 1  # m * 2^shift in units of 2^-149
    limb = (shift >> 4).astype(jnp.int32)
    r = shift & 15
    lo = (m << r) & _MASK
    mid = (m >> (16 - r)) & _MASK
    hi = (m >> 16) >> (16 - r)
    return limb, (lo, mid, hi)


def normalize(limbs):
    """Carries propagated: every limb of ``[..., LIMBS]`` int32 below 2^16."""
    out, carry = [], jnp.zeros(limbs.shape[:-1], jnp.int32)
    for j in range(LIMBS):
        v = limbs[..., j] + carry
        out.append(v & _MASK)
        carry = v >> _BITS
    return jnp.stack(out, axis=-1)


def zeros(shape):
    """The limbs of an all-zero ``shape`` table."""
    return jnp.zeros((*shape, LIMBS), jnp.int32)


def add(a, b):
    """The exact sum of two normalized limb tables."""
    return normalize(a + b)


@jax.jit
def merge(a, b):
    """``(limbs, rounded)``: the exact sum of two limb tables and its float32
    (one compiled call, also from eager code)."""
    limbs = add(a, b)
    return limbs, to_float32(limbs)


def _scatter(values, seg, slots):
    """CPU form of :func:`_block_sums`: three scatter-adds per entry."""
    limb, pieces = _pieces(values)
    cls = lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
    width = cls.shape[-1] if values.ndim == 2 else 1
    cls = cls if values.ndim == 2 else jnp.zeros_like(seg)
    size = width * slots * LIMBS
    base = jnp.where(seg < slots, (cls * slots + seg) * LIMBS + limb, size)
    acc = jnp.zeros((size,), jnp.int32)
    for j, piece in enumerate(pieces):
        idx = jnp.where(limb + j < LIMBS, base + j, size)
        acc = acc.at[idx.reshape(-1)].add(
            piece.astype(jnp.int32).reshape(-1), mode="drop"
        )
    return acc.reshape(*values.shape[1:], slots, LIMBS)


def _dense(values, seg, slots):
    """Plain form of :func:`_block_sums`: each entry's pieces laid out over
    the limbs, masked by slot and summed over the rows (one reduction; a
    TPU's scatter-adds touch far more bytes)."""
    limb, (lo, mid, hi) = _pieces(values)
    shape = (*values.shape, LIMBS)
    offset = lax.broadcasted_iota(jnp.int32, shape, values.ndim) - limb[..., None]
    spread = jnp.where(
        offset == 0,
        lo[..., None],
        jnp.where(
            offset == 1, mid[..., None], jnp.where(offset == 2, hi[..., None], 0)
        ),
    ).astype(jnp.int32)
    shape = (*values.shape, slots, 1)
    hit = lax.broadcasted_iota(jnp.int32, shape, values.ndim) == seg[..., None, None]
    return jnp.sum(jnp.where(hit, spread[..., None, :], 0), axis=0)


def _block_sums(values, seg, slots):
    """Limbs ``[..., slots, LIMBS]`` (not normalized) of at most :data:`ROWS`
    rows: by scatter-adds on the CPU, by one reduction elsewhere."""
    return lax.platform_dependent(
        values,
        seg,
        cpu=lambda v, s: _scatter(v, s, slots),
        default=lambda v, s: _dense(v, s, slots),
    )


def slot_sums(values, seg, slots):
    """Exact sums of the float32 non-negative ``values`` ``[N]`` or ``[N, K]``
    by slot ``seg`` (same shape, in ``[0, slots]``; ``slots``: dropped), per
    column: normalized limbs ``[slots, LIMBS]`` or ``[K, slots, LIMBS]``,
    in blocks of :data:`ROWS` rows."""
    n = values.shape[0]
    if n <= ROWS:
        return normalize(_block_sums(values, seg, slots))
    blocks = -(-n // ROWS)
    pad = [(0, blocks * ROWS - n)] + [(0, 0)] * (values.ndim - 1)
    values = jnp.pad(values, pad).reshape(blocks, ROWS, *values.shape[1:])
    seg = jnp.pad(seg, pad, constant_values=slots).reshape(values.shape)

    def body(acc, block):
        return add(acc, _block_sums(*block, slots)), None

    out, _ = lax.scan(body, zeros((*values.shape[2:], slots)), (values, seg))
    return out


def to_float32(limbs):
    """The float32 nearest (ties to even) to each normalized limb sum."""
    limbs = limbs.astype(jnp.int32)
    nonzero = limbs != 0
    top = LIMBS - 1 - jnp.argmax(nonzero[..., ::-1], axis=-1)

    def limb(offset):
        j = top - offset
        got = jnp.take_along_axis(limbs, jnp.maximum(j, 0)[..., None], axis=-1)
        return jnp.where(j >= 0, got[..., 0], 0).astype(jnp.uint32)

    t, l1, l2 = limb(0), limb(1), limb(2)
    index = lax.broadcasted_iota(jnp.int32, limbs.shape, limbs.ndim - 1)
    below = index < (top - 2)[..., None]
    sticky = jnp.any(nonzero & below, axis=-1)
    width = 32 - lax.clz(t).astype(jnp.int32)  # bits of the top limb, 1..16
    msb = _BITS * top + width - 1  # the highest set bit, in units of 2^-149
    # 25 bits from the highest set bit of the 48-bit window t | l1 | l2.
    hi32 = (t << 16) | l1
    s = (width + 7).astype(jnp.uint32)  # 8..23
    wide = s >= 16
    m25 = jnp.where(
        wide,
        hi32 >> jnp.where(wide, s - 16, 0),
        (hi32 << jnp.where(wide, 0, 16 - s)) | (l2 >> s),
    )
    lost = jnp.where(
        wide,
        (l2 != 0) | ((hi32 & ((jnp.uint32(1) << jnp.where(wide, s - 16, 0)) - 1)) != 0),
        (l2 & ((jnp.uint32(1) << s) - 1)) != 0,
    )
    sticky = sticky | lost
    m24 = m25 >> 1
    up = ((m25 & 1) == 1) & (sticky | ((m24 & 1) == 1))
    m24 = m24 + up.astype(jnp.uint32)
    carry = m24 >> 24  # rounded up to 2^24
    biased = (msb - 22).astype(jnp.uint32) + carry
    normal = (biased << 23) | ((m24 >> carry) & 0x7FFFFF)
    # Below 2^24 units the value is exact: the integer's own bits are the
    # float32's (a subnormal, or exponent field 1).
    small = (limbs[..., 0] | (limbs[..., 1] << 16)).astype(jnp.uint32)
    bits = jnp.where(msb < 24, small, normal)
    bits = jnp.where(jnp.any(nonzero, axis=-1), bits, jnp.uint32(0))
    return lax.bitcast_convert_type(bits, jnp.float32)
