r"""Shared pieces of the post-hoc fitters. Each minimises :math:`\sum_n
\omega_n \ell_n(\theta)`, weights summing to 1; excluded rows get weight 0 and
zeroed logits, so NaN/inf in padding reaches neither value nor gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax


def upcast(x) -> jax.Array:
    """``x`` as a JAX array of float32 or a wider float."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def canonical(logits, labels, where=None):
    """``(logits >= float32, labels int32, weights [N])``: excluded rows
    zeroed with label 0, weights summing to 1 (all 0 if no row is included)."""
    logits = upcast(logits)
    dtype = logits.dtype
    labels = jnp.asarray(labels).astype(jnp.int32)
    if where is None:
        mask = jnp.ones(labels.shape, bool)
    else:
        mask = jnp.asarray(where, bool)
        logits = jnp.where(mask[:, None], logits, jnp.zeros_like(logits))
        # An excluded row may hold any label (padding): a gather at one
        # outside [0, K) gives NaN, and 0 * NaN would poison the weighted sums.
        labels = jnp.where(mask, labels, 0)
    return logits, labels, mask_weights(mask, dtype)


def mask_weights(mask: jax.Array, dtype=jnp.float32) -> jax.Array:
    """``mask / sum(mask)`` as float ``[N]`` (zeros when the mask is empty)."""
    m = mask.astype(dtype)
    return m / jnp.maximum(jnp.sum(m), 1.0)


def pick(x: jax.Array, labels: jax.Array) -> jax.Array:
    """``x[n, labels[n]]`` for every row, ``[N]``."""
    return jnp.take_along_axis(x, labels[:, None], axis=-1)[:, 0]


def weighted_nll(logits: jax.Array, labels: jax.Array, weights: jax.Array):
    r""":math:`\sum_n \omega_n (-\log \mathrm{softmax}(z_n)_{y_n})`, scalar."""
    return jnp.sum(weights * per_example_nll(logits, labels))


def per_example_nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """``-log softmax(logits)[y]`` per row, ``[N]``."""
    return jax.nn.logsumexp(logits, axis=-1) - pick(logits, labels)


class LbfgsInfo(NamedTuple):
    """Iterations run, value and gradient max-norm of :func:`lbfgs_minimize`."""

    num_iter: jax.Array
    value: jax.Array
    grad_norm: jax.Array


def lbfgs_minimize(
    fun: Callable[[object], jax.Array],
    x0,
    *,
    max_iter: int,
    gtol: float = 1e-6,
    xtol: float = 1e-7,
    memory_size: int = 10,
):
    r"""Minimises ``fun`` with ``optax.lbfgs`` inside ``lax.while_loop``.

    One L-BFGS direction and zoom line search per iteration (Nocedal & Wright
    2006, Algs. 7.4-7.5, 3.5-3.6); stops after ``max_iter`` (may be traced)
    iterations, when the gradient's max-norm is at most ``gtol``, the step at
    most ``xtol * (1 + |x|)`` (max-norms), or the value non-finite. Under
    ``jax.vmap`` finished members keep their parameters. Returns ``(x,
    LbfgsInfo)``.
    """
    dtypes = jax.tree.map(lambda a: jnp.asarray(a).dtype, x0)
    given = fun

    def fun(x):
        # optax's line search steps are float64 in 64-bit mode; the objective
        # sees the dtype of x0, so a fit gives the same result in either mode.
        return given(jax.tree.map(lambda a, d: jnp.asarray(a).astype(d), x, dtypes))

    opt = optax.lbfgs(memory_size=memory_size)
    value_and_grad = optax.value_and_grad_from_state(fun)

    def max_norm(tree):
        leaves = jax.tree.leaves(tree)
        return jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in leaves]))

    def cond(carry):
        _, _, it, done = carry
        return (it < max_iter) & ~done

    def body(carry):
        x, state, it, _ = carry
        value, grad = value_and_grad(x, state=state)
        updates, state = opt.update(
            grad, state, x, value=value, grad=grad, value_fn=fun
        )
        x_new = optax.apply_updates(x, updates)
        new_value = optax.tree.get(state, "value")
        new_grad = optax.tree.get(state, "grad")
        small_grad = max_norm(new_grad) <= gtol
        small_step = max_norm(updates) <= xtol * (1.0 + max_norm(x_new))
        bad = ~jnp.isfinite(new_value)
        # A non-finite trial point is not accepted: keep the last good one.
        x_new = jax.tree.map(lambda a, b: jnp.where(bad, a, b), x, x_new)
        return x_new, state, it + 1, small_grad | small_step | bad

    state = opt.init(x0)
    carry = (x0, state, jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    x, state, it, _ = lax.while_loop(cond, body, carry)
    value, grad = value_and_grad(x, state=state)
    return x, LbfgsInfo(num_iter=it, value=value, grad_norm=max_norm(grad))


def class_sizes(labels: jax.Array, weights: jax.Array, num_classes: int):
    """Number of included rows per class, float ``[K]``."""
    included = (weights > 0).astype(weights.dtype)
    return jax.ops.segment_sum(included, labels, num_segments=num_classes)


def class_mean_losses(
    losses: jax.Array, labels: jax.Array, weights: jax.Array, num_classes: int
):
    """Per-class mean of ``losses`` over included rows, ``[K]`` (0 if none)."""
    included = weights > 0
    sums = jax.ops.segment_sum(
        jnp.where(included, losses, 0.0), labels, num_segments=num_classes
    )
    counts = class_sizes(labels, weights, num_classes)
    return sums / jnp.maximum(counts, 1.0)


def fit_nll_lbfgs(
    transform, params0, logits, labels, weights, *, max_iter, tol, penalty=None
):
    """L-BFGS from ``params0`` on the weighted NLL of ``transform`` (+ penalty)."""
    logits = jax.lax.stop_gradient(logits)

    def objective(params):
        value = weighted_nll(transform(params, logits), labels, weights)
        if penalty is not None:
            value = value + penalty(params)
        return value

    params, _ = lbfgs_minimize(objective, params0, max_iter=max_iter, gtol=tol)
    return params


def as_key(seed):
    """A PRNG key from an int seed, an integer array or a key (returned as is)."""
    if isinstance(seed, (int,)) and not isinstance(seed, bool):
        return jax.random.key(seed)
    seed = jnp.asarray(seed)
    if jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return seed
    return jax.random.key(seed)
