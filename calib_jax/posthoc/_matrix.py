r"""Vector and matrix scaling (Guo et al. 2017)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import _checks, _memory
from calib_jax.posthoc import _core, _validate

KINDS = ("vector", "matrix")
# Copies of the parameters an L-BFGS fit holds at once: its 10-pair history
# (20) plus gradients, search directions and line-search points.
LBFGS_COPIES = 30


def check_square_fit(k: int, dtype, what: str) -> None:
    """One-line ``ValueError`` when an L-BFGS fit of a ``[K, K]`` matrix and a
    ``[K]`` bias cannot fit in the default device's memory; ``what`` names
    the fit in the message."""
    k = int(k)
    size = k * k + k
    itemsize = jnp.promote_types(dtype, jnp.float32).itemsize
    _memory.check_fits(
        LBFGS_COPIES * size * itemsize,
        f"{what} at K = {k} classes ({size} parameters, about {LBFGS_COPIES} "
        "copies of them in the L-BFGS fit)",
        fix="use a calibrator with O(K) parameters ('ts', 'ets' or 'vector')",
    )


def apply_vector_scaling(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Vector scaling :math:`w \odot z + b` (not accuracy-preserving).

    .. math::

        \hat z = \operatorname{diag}(w)\, z + b \qquad
        \text{(Sec. 4.2 of [1], matrix scaling with diagonal } W)

    Args:
      params: ``{'w': float [K], 'b': float [K]}`` from
        :func:`fit_vector_scaling`.
      logits: float ``[N, K]``.

    Returns:
      float ``[N, K]`` calibrated logits. Per-class scales and offsets can
      reorder the logits, so accuracy may change.

    References:
      [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, "On Calibration of
      Modern Neural Networks", ICML 2017, arXiv:1706.04599v2, Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([0.0, -1.0])}
      >>> print(apply_vector_scaling(params, jnp.array([[1.0, 1.0]])))
      [[1. 1.]]
    """
    logits = _core.upcast(logits)
    return apply_vector_params(params, logits)


def apply_matrix_scaling(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Matrix scaling :math:`W z + b` (not accuracy-preserving).

    .. math::

        \hat z = W z + b \qquad \text{(Sec. 4.2 of [1])}

    Args:
      params: ``{'W': float [K, K], 'b': float [K]}`` from
        :func:`fit_matrix_scaling`.
      logits: float ``[N, K]``.

    Returns:
      float ``[N, K]`` calibrated logits; accuracy may change.

    References:
      [1] C. Guo et al., ICML 2017, arXiv:1706.04599v2, Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"W": jnp.eye(2), "b": jnp.array([0.5, 0.0])}
      >>> print(apply_matrix_scaling(params, jnp.array([[1.0, 1.0]])))
      [[1.5 1. ]]
    """
    logits = _core.upcast(logits)
    return apply_matrix_params(params, logits)


def apply_vector_params(params, logits):
    """``apply_fn`` of a vector-scaling :class:`~calib_jax.posthoc.Calibrator`."""
    w = params["w"].astype(logits.dtype)[None, :]
    return logits * w + params["b"].astype(logits.dtype)[None, :]


def apply_matrix_params(params, logits):
    """``apply_fn`` of a matrix-scaling :class:`~calib_jax.posthoc.Calibrator`."""
    w = params["W"].astype(logits.dtype)
    return logits @ w.T + params["b"].astype(logits.dtype)[None, :]


def fit_vector_scaling(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> dict[str, jax.Array]:
    r"""Fits vector scaling by NLL (L-BFGS from :math:`w = 1, b = 0`).

    .. math::

        \min_{w, b} -\sum_n \omega_n \log\mathrm{softmax}(w \odot z_n + b)_{y_n}

    No regularisation (as in [1]).

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: L-BFGS iteration cap (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'w': float32 [K], 'b': float32 [K]}``.

    References:
      [1] C. Guo et al., ICML 2017, arXiv:1706.04599v2, Sec. 4.2.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 3))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> sorted(fit_vector_scaling(z, y))
      ['b', 'w']
    """
    return _public_fit("vector", logits, labels, where, max_iter, tol)


def fit_matrix_scaling(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> dict[str, jax.Array]:
    r"""Fits matrix scaling by NLL (L-BFGS from :math:`W = I, b = 0`).

    .. math::

        \min_{W, b} -\sum_n \omega_n \log\mathrm{softmax}(W z_n + b)_{y_n}

    No regularisation (as in [1]); with :math:`K^2 + K` parameters it
    overfits small validation sets (Sec. 5 of [1]); see
    :func:`fit_dirichlet` for the regularised variant.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: L-BFGS iteration cap (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'W': float32 [K, K], 'b': float32 [K]}``.

    References:
      [1] C. Guo et al., ICML 2017, arXiv:1706.04599v2, Sec. 4.2, Sec. 5.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 3))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> fit_matrix_scaling(z, y)["W"].shape
      (3, 3)
    """
    return _public_fit("matrix", logits, labels, where, max_iter, tol)


def _public_fit(kind, logits, labels, where, max_iter, tol):
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    if kind == "matrix":
        check_square_fit(logits.shape[-1], logits.dtype, "fit_matrix_scaling")
    params = _fit(logits, labels, where, tol, kind=kind, max_iter=max_iter)
    _validate.warn_if_suspicious(logits, labels, where, name=f"fit_{kind}_scaling")
    return params


@functools.partial(jax.jit, static_argnames=("kind",))
def _fit(logits, labels, where, tol, *, kind, max_iter):
    z, labels, w = _core.canonical(logits, labels, where)
    k = z.shape[-1]
    if kind == "vector":
        params0 = {"w": jnp.ones((k,), z.dtype), "b": jnp.zeros((k,), z.dtype)}
        transform = apply_vector_params
    else:
        params0 = {"W": jnp.eye(k, dtype=z.dtype), "b": jnp.zeros((k,), z.dtype)}
        transform = apply_matrix_params
    return _core.fit_nll_lbfgs(
        transform, params0, z, labels, w, max_iter=max_iter, tol=tol
    )
