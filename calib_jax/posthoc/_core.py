r"""Shared pieces of the post-hoc fitters: input canonicalisation, sample
weights, the weighted negative log-likelihood and a jittable L-BFGS loop.

Every fitter minimises a *weighted* objective :math:`\sum_n \omega_n
\ell_n(\theta)` with weights :math:`\omega_n \ge 0` summing to one. Plain
fitting uses :math:`\omega_n = 1[\text{where}_n] / N_{\text{valid}}`; the
class-wise loss scaling of ``_classwise_scaling.py`` passes per-class weights
instead. Excluded rows get weight 0 and their logits are zeroed first, so
NaN/inf in padding reaches neither value nor gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax


def upcast(x) -> jax.Array:
    """``x`` as a JAX array of float32, or of a wider float (bf16/fp16 and
    integers become float32)."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def canonical(logits, labels, where=None):
    """Upcasts logits to >= float32, labels to int32, and builds the weights.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]``.
      where: optional bool ``[N]``; ``False`` rows get weight 0.

    Returns:
      ``(logits, labels, weights)`` with excluded rows of ``logits`` zeroed
      (and their labels set to 0) and ``weights`` float ``[N]`` summing to 1
      (all zero when nothing is included).
    """
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
    nll = jax.nn.logsumexp(logits, axis=-1) - pick(logits, labels)
    return jnp.sum(weights * nll)


def per_example_nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """``-log softmax(logits)[y]`` per row, ``[N]``."""
    return jax.nn.logsumexp(logits, axis=-1) - pick(logits, labels)


class LbfgsInfo(NamedTuple):
    """Diagnostics of :func:`lbfgs_minimize` (all scalars).

    Attributes:
      num_iter: L-BFGS iterations run.
      value: objective at the returned parameters.
      grad_norm: max-norm of its gradient there.
    """

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

    Each iteration computes one L-BFGS direction and a zoom line search
    (strong Wolfe conditions); the value and gradient the line search computed
    at the accepted point are reused through ``optax.value_and_grad_from_state``,
    so an iteration costs one objective-and-gradient evaluation per line-search
    trial (usually one). The loop stops after ``max_iter`` iterations, when the
    max-norm of the gradient is at most ``gtol``, when the step is at most
    ``xtol * (1 + |x|)`` (max-norms), or when the value becomes non-finite.

    Pure and jittable; under ``jax.vmap`` the loop runs until every member
    has stopped (finished members keep their parameters).

    Args:
      fun: scalar objective of a parameter pytree.
      x0: initial parameter pytree (float arrays).
      max_iter: maximum number of iterations (may be traced).
      gtol: gradient max-norm tolerance.
      xtol: relative step tolerance.
      memory_size: static L-BFGS memory.

    Returns:
      ``(x, info)`` with the final parameters and an :class:`LbfgsInfo`.

    References:
      [1] J. Nocedal and S. Wright, "Numerical Optimization", 2nd ed., 2006,
      Alg. 7.4–7.5 (L-BFGS) and Alg. 3.5–3.6 (zoom line search).
    """
    dtypes = jax.tree.map(lambda a: jnp.asarray(a).dtype, x0)
    given = fun

    def fun(x):
        # optax's line search forms trial points with float64 step sizes in
        # 64-bit mode; the objective always sees the dtype of x0 (that of
        # the logits), so a fit gives the same result in either mode.
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
    """Per-class mean of per-example losses over included rows, ``[K]``.

    Classes without an included row get 0.
    """
    included = weights > 0
    sums = jax.ops.segment_sum(
        jnp.where(included, losses, 0.0), labels, num_segments=num_classes
    )
    counts = class_sizes(labels, weights, num_classes)
    return sums / jnp.maximum(counts, 1.0)


def fit_nll_lbfgs(
    transform, params0, logits, labels, weights, *, max_iter, tol, penalty=None
):
    """L-BFGS on ``sum_n w_n NLL(transform(params, logits))_n (+ penalty)``.

    Args:
      transform: ``(params, logits [N, K]) -> calibrated logits [N, K]``.
      params0: initial parameter pytree.
      logits, labels, weights: the data (weights sum to 1).
      max_iter: iteration cap (may be traced).
      tol: gradient max-norm tolerance.
      penalty: optional ``params -> scalar`` regulariser.

    Returns:
      The fitted parameters.
    """
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
