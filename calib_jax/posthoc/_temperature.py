r"""Temperature scaling (Guo et al. 2017) in :math:`u = \log T`: the map, the
row sums of its softmax, and the NLL and SB-ECE objectives of :math:`u`.

Every objective of temperature scaling sees the logits only through, per row
:math:`n` and inverse temperature :math:`s = 1/T = e^{-u}`,

.. math::

    S_n(s) = \sum_k e^{s (z_{nk} - m_n)}, \qquad m_n = \max_k z_{nk}:

the NLL is :math:`\sum_n \omega_n (\log S_n(s) + s (m_n - z_{ny_n}))`, the
top-label confidence :math:`c_n = 1 / S_n(s)` and the correctness
(:math:`z_{ny_n} = m_n`) does not depend on :math:`T`. The functions below are
the plain forms (one pass over ``[N, K]``, JAX autodiff in :math:`u`);
kernel family ``'posthoc_temperature'`` of :mod:`calib_jax.kernels` swaps in
their CPU drop-ins (``_cpu_kernels.py``: row blocks, fused derivatives).
Float64 references in ``tests/_reference_posthoc.py``. :func:`fit_temperature`
(``_temperature_fit.py``) fits :math:`T` by any of :data:`OBJECTIVES`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax import kernels, losses
from calib_jax.posthoc import _base, _core, _cpu_kernels, _validate

OBJECTIVES = ("nll", "sb_ece", "hb_ece", "ece_grid")


def apply_temperature(
    logits: jax.typing.ArrayLike, t: jax.typing.ArrayLike
) -> jax.Array:
    r"""Temperature-scaled logits :math:`z / T` (accuracy-preserving).

    .. math::

        \mathrm{TS}(z) = z / T, \qquad T > 0 \quad \text{(Eq. (12) of [1])}

    Dividing by a positive scalar keeps the order of the logits, so the
    argmax (and hence accuracy) is unchanged.

    Args:
      logits: float ``[..., K]`` logits.
      t: positive temperature, scalar (or broadcastable to ``logits[..., :1]``).

    Returns:
      float ``[..., K]`` calibrated logits (float32 for low-precision input).

    Raises:
      ValueError: a concrete ``t`` that is not finite and > 0.

    References:
      [1] S. Jung et al., "Scaling of Class-wise Training Losses for Post-hoc
      Calibration", ICML 2023, PMLR 202, Eq. (12); C. Guo et al., "On
      Calibration of Modern Neural Networks", ICML 2017, arXiv:1706.04599v2,
      Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(apply_temperature(jnp.array([[2.0, 1.0]]), 2.0))
      [[1.  0.5]]
    """
    t = _validate.check_temperature(t)
    logits = jnp.asarray(logits)
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    return logits.astype(dtype) / t.astype(dtype)


@kernels.dispatch("posthoc_temperature", _cpu_kernels.exp_sums)
def exp_sums(z: jax.Array, m: jax.Array, s: jax.Array) -> jax.Array:
    r""":math:`S_n(s)`, ``[N]``, of ``z`` ``[N, K]`` (excluded rows zeroed)
    with row maxima ``m`` ``[N]`` at ``s`` > 0, a scalar or per row ``[N]``."""
    d = z - m[:, None]
    return jnp.sum(jnp.exp((s[:, None] if jnp.ndim(s) == 1 else s) * d), axis=1)


@kernels.dispatch("posthoc_temperature", _cpu_kernels.nll_of_log_t)
def nll_of_log_t(u, z, m, a, w):
    r"""Weighted NLL :math:`\sum_n w_n(\log S_n(e^{-u}) + e^{-u} a_n)` of
    :math:`z / e^u`.

    ``u`` is a scalar :math:`\log T` or per row ``[N]`` (PTS); ``z`` ``[N, K]``
    logits, ``m`` ``[N]`` their row maxima, ``a = m - z_y`` ``[N]`` and
    weights ``w`` ``[N]`` are constants of the fit (callers stop their
    gradients; the CPU drop-in differentiates in ``u`` only).
    """
    s = jnp.exp(-u)
    return jnp.sum(w * (jnp.log(exp_sums.plain(z, m, s)) + s * a))


@kernels.dispatch("posthoc_temperature", _cpu_kernels.top_confidence_of_log_t)
def top_confidence_of_log_t(u, z, m):
    r"""Top-label confidences :math:`c_n = 1 / S_n(e^{-u})` of :math:`z / e^u`,
    ``[N]``; ``u`` scalar or ``[N]``, ``z``, ``m`` constants as in
    :func:`nll_of_log_t`."""
    return 1.0 / exp_sums.plain(z, m, jnp.exp(-u))


def nll_objective(logits, labels, weights):
    """``u -> sum_n w_n NLL_n(z / exp(u))``, differentiable in ``u``.

    Args:
      logits: float ``[N, K]`` (excluded rows zeroed).
      labels: int ``[N]``.
      weights: float ``[N]`` non-negative, summing to 1.

    Returns:
      A scalar function of :math:`u = \\log T` (scalar or ``[N]``).
    """
    z = jax.lax.stop_gradient(logits)
    m = jnp.max(z, axis=-1)
    a = m - _core.pick(z, labels)
    w = jax.lax.stop_gradient(weights)
    return lambda u: nll_of_log_t(u, z, m, a, w)


def fit_log_t_nll(logits, labels, weights, u0, *, max_iter, tol=1e-6):
    """L-BFGS on the weighted NLL in ``u = log T`` from ``u0``; returns ``u``."""
    u, _ = _core.lbfgs_minimize(
        nll_objective(logits, labels, weights), u0, max_iter=max_iter, gtol=tol
    )
    return u


@jax.jit
def fit_nll(logits, labels, where, tol, *, max_iter):
    """The NLL temperature (float32 scalar) from :math:`T = 1`."""
    z, labels, w = _core.canonical(logits, labels, where)
    u = fit_log_t_nll(z, labels, w, jnp.zeros((), z.dtype), max_iter=max_iter, tol=tol)
    return jnp.exp(u).astype(jnp.float32)


def sb_ece_objective(logits, labels, where, *, num_bins, temperature, p, kind):
    r"""``u -> SB-ECE of softmax(z / exp(u))``, differentiable in ``u``.

    The value of :func:`calib_jax.losses.sb_ece` on the scaled logits without
    their ``[N, K]`` softmax: SB-ECE sees them only through the top-label
    confidences (:func:`top_confidence_of_log_t`) and the correctness (the
    first arg-max index is the label, the library's rule); the soft binning
    is ``O(N M)`` work on ``[N]`` vectors.

    Args:
      logits: float ``[N, K]`` (excluded rows zeroed).
      labels: int ``[N]``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      num_bins: static number of bins :math:`M`.
      temperature: soft-binning temperature.
      p: norm order.
      kind: static ``'lb'`` or ``'bin'``.

    Returns:
      A scalar function of :math:`u = \log T`.
    """
    z = jax.lax.stop_gradient(logits)
    m = jnp.max(z, axis=-1)
    correct = (jnp.argmax(z, axis=-1) == labels).astype(z.dtype)
    mask = jnp.ones(m.shape, bool) if where is None else jnp.asarray(where, bool)

    def objective(u):
        conf = top_confidence_of_log_t(u, z, m)
        return losses.sb_ece_from_confidences(
            conf, correct, mask, temperature, p, num_bins=num_bins, kind=kind
        )

    return objective


def apply_ts_params(params, logits):
    """``apply_fn`` of a TS :class:`~calib_jax.posthoc.Calibrator`."""
    return logits / params["temperature"].astype(logits.dtype)


def check_ts_params(params, *, values: bool = True) -> None:
    """TS parameters ``{'temperature': []}``, finite and > 0 (any K)."""
    t = _base.param_arrays(params, {"temperature": 0})["temperature"]
    if values:
        _base.check_param_values("params['temperature']", t, positive=True)


def ts_method(*, max_iter: int = 100, tol: float = 1e-6):
    """TS with the NLL objective as a :class:`~calib_jax.posthoc.Method`."""

    def init(logits, labels, weights, key):
        del labels, weights, key
        return {"temperature": jnp.ones((), logits.dtype)}

    def train(params, logits, labels, weights, budget):
        u0 = jnp.log(params["temperature"]).astype(logits.dtype)
        u = fit_log_t_nll(logits, labels, weights, u0, max_iter=budget, tol=tol)
        return {"temperature": jnp.exp(u)}

    return _base.Method("ts", init, train, apply_ts_params, max_iter, True)
