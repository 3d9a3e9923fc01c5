r"""Row-blocked passes over ``[N, K]`` logits for scalar temperature fits.

Temperature scaling only ever needs, per row :math:`n` and inverse temperature
:math:`s = 1/T`,

.. math::

    S_n(s) = \sum_k e^{s (z_{nk} - m_n)}, \qquad
    W_n(s) = \sum_k e^{s (z_{nk} - m_n)} (z_{nk} - m_n), \qquad
    m_n = \max_k z_{nk},

from which the NLL, the top-label confidence :math:`c_n = 1 / S_n` and their
derivatives in :math:`s` (:math:`\partial c_n / \partial s = -W_n / S_n^2`)
follow. Computing :math:`S` and :math:`W` together over
the whole array makes XLA:CPU materialise the ``[N, K]`` exponentials (a
fresh buffer per call, several times slower than the arithmetic). The pass
below walks over blocks of rows (about :data:`BLOCK_ELEMENTS` entries each) in
a ``lax.fori_loop``, so the exponentials of one block stay in cache and
:math:`S, W` cost one read of the logits. The last block is shifted back to
end at row ``N`` (it recomputes a few rows, writing the same values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# Entries of the logits per block: large enough to amortise the loop, small
# enough for the block's temporaries to stay in cache.
BLOCK_ELEMENTS = 1 << 19


def block_rows(n: int, k: int) -> int:
    """Static number of rows per block for ``[n, k]`` logits."""
    return int(max(1, min(n, BLOCK_ELEMENTS // max(k, 1))))


def exp_sums(z: jax.Array, m: jax.Array, s: jax.Array, *, with_w: bool):
    r"""Returns :math:`S(s)` (and :math:`W(s)` when ``with_w``), each ``[N]``.

    Args:
      z: float ``[N, K]`` logits (excluded rows already zeroed).
      m: float ``[N]`` row maxima of ``z``.
      s: inverse temperature :math:`1/T > 0`, scalar or per row ``[N]``.
      with_w: static; also return :math:`W`.
    """
    n, k = z.shape
    rows = block_rows(n, k)
    num_blocks = -(-n // rows)
    per_row = jnp.ndim(s) == 1

    def body(i, acc):
        start = jnp.minimum(i * rows, n - rows)
        zb = lax.dynamic_slice_in_dim(z, start, rows, 0)
        mb = lax.dynamic_slice_in_dim(m, start, rows, 0)
        sb = lax.dynamic_slice_in_dim(s, start, rows, 0)[:, None] if per_row else s
        db = zb - mb[:, None]
        e = jnp.exp(sb * db)
        outs = (jnp.sum(e, axis=1),)
        if with_w:
            outs += (jnp.sum(e * db, axis=1),)
        return tuple(
            lax.dynamic_update_slice_in_dim(a, o, start, 0) for a, o in zip(acc, outs)
        )

    init = tuple(jnp.zeros((n,), z.dtype) for _ in range(2 if with_w else 1))
    out = lax.fori_loop(0, num_blocks, body, init)
    return out if with_w else out[0]


def top_confidence(z: jax.Array, m: jax.Array, s: jax.Array) -> jax.Array:
    r"""Top-label confidence :math:`\max_k \mathrm{softmax}(s z)_k`, ``[N]``."""
    return 1.0 / exp_sums(z, m, s, with_w=False)
