"""CPU drop-ins for plain forms of :mod:`calib_jax.conformal` (see
:mod:`calib_jax.kernels`).

Kernel family ``'conformal_row_sort'``: the descending sort of each row of
probabilities behind APS and RAPS (plain form ``_scores.sort_desc``). XLA:CPU
sorts rows with a comparator call per comparison, about 1 us per entry on
rows of 10; for up to :data:`MAX_NETWORK` classes a fixed sorting network
(Batcher's odd-even merge sort) does the same with element-wise ``maximum``
and ``minimum`` over the class columns, vectorised across rows. It returns
the same values (a network only moves values), so scores and sets are bit
for bit those of the sort.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

# Up to this many classes the network is used (63 comparators at 16, 191 at
# 32); above, the plain sort.
MAX_NETWORK = 32


@functools.cache
def network(n: int) -> tuple[tuple[int, int], ...]:
    """Comparator pairs ``(i, j)``, ``i < j``, of Batcher's odd-even merge
    sort of ``n`` entries (a power of two)."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple(pairs)


def sort_desc(probs):
    """Drop-in for ``_scores.sort_desc``: each row in decreasing order."""
    k = probs.shape[-1]
    if k > MAX_NETWORK:
        return -jnp.sort(-probs, axis=-1)
    size = 1 << max(k - 1, 0).bit_length()
    low = jnp.full(probs.shape[:-1], -jnp.inf, probs.dtype)
    cols = [probs[..., j] for j in range(k)] + [low] * (size - k)
    for i, j in network(size):
        cols[i], cols[j] = jnp.maximum(cols[i], cols[j]), jnp.minimum(cols[i], cols[j])
    return jnp.stack(cols[:k], axis=-1)
