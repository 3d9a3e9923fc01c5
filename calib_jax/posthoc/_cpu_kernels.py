r"""CPU drop-ins for plain forms of :mod:`calib_jax.posthoc` (see
:mod:`calib_jax.kernels`).

Kernel family ``'posthoc_temperature'``: the row sums :math:`S_n(s)` of
temperature scaling and the NLL and top-label confidences in
:math:`u = \log T` (plain forms and their equations in ``_temperature.py``).
On XLA:CPU the plain one-pass sums materialise the ``[N, K]`` exponentials (a
fresh buffer per call), and JAX autodiff makes a second pass for the
derivative. Here a ``lax.fori_loop`` walks over blocks of rows (about
:data:`BLOCK_ELEMENTS` entries each) so one block's exponentials stay in cache,
and a custom JVP computes the derivative from the same pass, using

.. math::

    W_n(s) = \sum_k e^{s (z_{nk} - m_n)} (z_{nk} - m_n) = S_n'(s).

The last block is shifted back to end at row ``N`` (it recomputes a few rows,
writing the same values).
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


def exp_sums(z, m, s, *, with_w: bool = False):
    """Drop-in for ``_temperature.exp_sums``: :math:`S(s)` (and :math:`W(s)`
    when ``with_w``), each ``[N]``, one block of rows at a time."""
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

    # The dtype the plain form returns (s may be wider than z).
    dtype = jnp.result_type(z, m, s)
    init = tuple(jnp.zeros((n,), dtype) for _ in range(2 if with_w else 1))
    out = lax.fori_loop(0, num_blocks, body, init)
    return out if with_w else out[0]


@jax.custom_jvp
def nll_of_log_t(u, z, m, a, w):
    """Drop-in for ``_temperature.nll_of_log_t`` with its derivative in ``u``
    from the same blocked pass (none for the other arguments)."""
    s = jnp.exp(-u)
    return jnp.sum(w * (jnp.log(exp_sums(z, m, s)) + s * a))


@nll_of_log_t.defjvp
def _nll_of_log_t_jvp(primals, tangents):
    u, z, m, a, w = primals
    s = jnp.exp(-u)
    big_s, big_w = exp_sums(z, m, s, with_w=True)
    value = jnp.sum(w * (jnp.log(big_s) + s * a))
    # d/du_n of the row-n term: -s_n w_n (W_n / S_n + m_n - z_ny).
    slope = -s * w * (big_w / big_s + a)
    return value, jnp.sum(slope * tangents[0])


@jax.custom_jvp
def top_confidence_of_log_t(u, z, m):
    """Drop-in for ``_temperature.top_confidence_of_log_t`` with its
    derivative in ``u`` from the same blocked pass (none for ``z``, ``m``)."""
    return 1.0 / exp_sums(z, m, jnp.exp(-u))


@top_confidence_of_log_t.defjvp
def _top_confidence_of_log_t_jvp(primals, tangents):
    u, z, m = primals
    s = jnp.exp(-u)
    big_s, big_w = exp_sums(z, m, s, with_w=True)
    c = 1.0 / big_s
    # dc_n/du = -(dS_n/ds)(ds/du) / S_n^2 = s W_n c_n^2.
    return c, s * big_w * c * c * tangents[0]
