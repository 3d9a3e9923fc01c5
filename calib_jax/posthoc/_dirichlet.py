r"""Dirichlet calibration with ODIR regularisation (Kull et al. 2019)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.posthoc import _core, _matrix, _validate


def apply_dirichlet(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Dirichlet calibration map: :math:`W \log \mathrm{softmax}(z) + b`.

    .. math::

        \hat q = \mathrm{softmax}\big(W \ln q + b\big), \qquad
        q = \mathrm{softmax}(z),

    the Dirichlet calibration map of [1], with ``log_softmax(z)`` for
    :math:`\ln q` (no clipping). **Not accuracy-preserving**.

    Args:
      params: ``{'W': float [K, K], 'b': float [K]}`` from
        :func:`fit_dirichlet`.
      logits: float ``[N, K]``.

    Returns:
      float ``[N, K]`` calibrated logits.

    References:
      [1] M. Kull, M. Perello-Nieto, M. Kängsepp, T. Silva Filho, H. Song,
      P. Flach, "Beyond Temperature Scaling: Obtaining Well-Calibrated
      Multiclass Probabilities with Dirichlet Calibration", NeurIPS 2019,
      arXiv:1910.12656 (the Dirichlet calibration map).

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"W": jnp.eye(2), "b": jnp.zeros(2)}
      >>> print(apply_dirichlet(params, jnp.array([[0.0, 0.0]])).round(4))
      [[-0.6931 -0.6931]]
    """
    logits = _core.upcast(logits)
    return apply_dirichlet_params(params, logits)


def apply_dirichlet_params(params, logits):
    """``apply_fn`` of a Dirichlet :class:`~calib_jax.posthoc.Calibrator`."""
    log_q = jax.nn.log_softmax(logits, axis=-1)
    w = params["W"].astype(logits.dtype)
    return log_q @ w.T + params["b"].astype(logits.dtype)[None, :]


def odir_penalty(params, off_diagonal, intercept):
    """The ODIR penalty of :func:`fit_dirichlet` (scalar)."""
    w, b = params["W"], params["b"]
    k = w.shape[0]
    off = jnp.sum(w**2) - jnp.sum(jnp.diagonal(w) ** 2)
    # A Python float: an int32 constant K(K-1) overflows from K = 46,342.
    pairs = float(k * (k - 1))
    return off_diagonal * off / pairs + intercept * jnp.sum(b**2) / float(k)


def dirichlet_objective(params, logits, labels, weights, off_diagonal, intercept):
    r"""Weighted NLL of the Dirichlet map plus the ODIR penalty (scalar)."""
    value = _core.weighted_nll(apply_dirichlet_params(params, logits), labels, weights)
    return value + odir_penalty(params, off_diagonal, intercept)


def fit_dirichlet(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    off_diagonal: float = 1e-2,
    intercept: float = 1e-2,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> dict[str, jax.Array]:
    r"""Fits Dirichlet calibration with ODIR by L-BFGS from the identity.

    .. math::

        \min_{W, b}\; -\sum_n \omega_n \log \mathrm{softmax}(W \ln q_n +
        b)_{y_n} + \frac{\lambda}{K(K-1)} \sum_{i \ne j} W_{ij}^2 +
        \frac{\mu}{K} \sum_{j} b_j^2,

    :math:`\lambda` = ``off_diagonal``, :math:`\mu` = ``intercept``,
    :math:`\omega_n = 1/N` (ODIR: off-diagonal and intercept regularisation).
    [1] selects :math:`\lambda, \mu` by cross-validation; the defaults here
    are fixed. Not accuracy-preserving.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      off_diagonal: :math:`\lambda \ge 0`.
      intercept: :math:`\mu \ge 0`.
      max_iter: L-BFGS iteration cap (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'W': float32 [K, K], 'b': float32 [K]}``.

    References:
      [1] M. Kull et al., NeurIPS 2019, arXiv:1910.12656 (the calibration map
      and its ODIR regularisation).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 3))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> fit_dirichlet(z, y)["W"].shape
      (3, 3)
    """
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    off_diagonal = _validate.check_nonnegative("off_diagonal", off_diagonal)
    intercept = _validate.check_nonnegative("intercept", intercept)
    _matrix.check_square_fit(logits.shape[-1], logits.dtype, "fit_dirichlet")
    params = _fit(
        logits, labels, where, off_diagonal, intercept, tol, max_iter=max_iter
    )
    _validate.warn_if_suspicious(logits, labels, where, name="fit_dirichlet")
    return params


@jax.jit
def _fit(logits, labels, where, off_diagonal, intercept, tol, *, max_iter):
    z, labels, w = _core.canonical(logits, labels, where)
    k = z.shape[-1]
    params0 = {"W": jnp.eye(k, dtype=z.dtype), "b": jnp.zeros((k,), z.dtype)}
    return _core.fit_nll_lbfgs(
        apply_dirichlet_params,
        params0,
        z,
        labels,
        w,
        max_iter=max_iter,
        tol=tol,
        penalty=lambda p: odir_penalty(p, off_diagonal, intercept),
    )
