r"""Temperature scaling (Guo et al. 2017) in :math:`u = \log T`: the map, the row
sums :math:`S_n(s) = \sum_k e^{s (z_{nk} - m_n)}` of its softmax at :math:`s =
e^{-u}`, and the NLL and SB-ECE objectives of :math:`u` (CPU drop-ins: kernels)."""

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
    :math:`z / e^u`; ``u`` scalar or ``[N]`` (PTS). ``z [N, K]``, row maxima
    ``m``, ``a = m - z_y`` and ``w`` are constants (callers stop their
    gradients; the CPU drop-in differentiates in ``u`` only)."""
    s = jnp.exp(-u)
    return jnp.sum(w * (jnp.log(exp_sums.plain(z, m, s)) + s * a))


@kernels.dispatch("posthoc_temperature", _cpu_kernels.top_confidence_of_log_t)
def top_confidence_of_log_t(u, z, m):
    r"""Top-label confidences :math:`c_n = 1 / S_n(e^{-u})` of :math:`z / e^u`,
    ``[N]``; ``u`` scalar or ``[N]``, ``z``, ``m`` constants as in
    :func:`nll_of_log_t`."""
    return 1.0 / exp_sums.plain(z, m, jnp.exp(-u))


def nll_objective(logits, labels, weights):
    """``u -> sum_n w_n NLL_n(z / exp(u))`` for ``u`` scalar or ``[N]``;
    ``logits [N, K]`` with excluded rows zeroed, ``weights [N]`` summing to 1."""
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
    r"""``u -> SB-ECE of softmax(z / exp(u))`` (:func:`calib_jax.losses.sb_ece`)
    from the top-label confidences only; ``logits [N, K]`` with excluded rows
    zeroed, ``num_bins`` and ``kind`` static."""
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
