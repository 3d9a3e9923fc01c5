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

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import kernels

# Entries of the logits per block: large enough to amortise the loop, small
# enough for the block's temporaries to stay in cache.
BLOCK_ELEMENTS = 1 << 19


def block_rows(n: int, k: int) -> int:
    """Static number of rows per block for ``[n, k]`` logits."""
    return int(max(1, min(n, BLOCK_ELEMENTS // max(k, 1))))


def exp_sums(z: jax.Array, m: jax.Array, s: jax.Array, *, with_w: bool):
    r"""Returns :math:`S(s)` (and :math:`W(s)` when ``with_w``), each ``[N]``.

    Kernel family ``'posthoc_temperature'`` (:mod:`calib_jax.kernels`): tuned
    :func:`_exp_sums_blocked`, plain :func:`exp_sums_plain`; float64
    references in ``tests/_reference_posthoc.py``.

    Args:
      z: float ``[N, K]`` logits (excluded rows already zeroed).
      m: float ``[N]`` row maxima of ``z``.
      s: inverse temperature :math:`1/T > 0`, scalar or per row ``[N]``.
      with_w: static; also return :math:`W`.
    """
    return kernels.select(
        "posthoc_temperature",
        functools.partial(_exp_sums_blocked, with_w=with_w),
        functools.partial(exp_sums_plain, with_w=with_w),
        z,
        m,
        s,
    )


def exp_sums_plain(z, m, s, *, with_w: bool):
    """Plain :func:`exp_sums`: one pass over the whole ``[N, K]`` array."""
    d = z - m[:, None]
    e = jnp.exp((s[:, None] if jnp.ndim(s) == 1 else s) * d)
    if with_w:
        return jnp.sum(e, axis=1), jnp.sum(e * d, axis=1)
    return jnp.sum(e, axis=1)


def _exp_sums_blocked(z, m, s, *, with_w: bool):
    """:func:`exp_sums` in a ``lax.fori_loop`` over blocks of rows."""
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

    # The dtype exp_sums_plain returns (s may be wider than z).
    dtype = jnp.result_type(z, m, s)
    init = tuple(jnp.zeros((n,), dtype) for _ in range(2 if with_w else 1))
    out = lax.fori_loop(0, num_blocks, body, init)
    return out if with_w else out[0]


def top_confidence(z: jax.Array, m: jax.Array, s: jax.Array) -> jax.Array:
    r"""Top-label confidence :math:`\max_k \mathrm{softmax}(s z)_k`, ``[N]``."""
    return 1.0 / exp_sums(z, m, s, with_w=False)
