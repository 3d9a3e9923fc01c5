r"""Class-based temperature scaling (CTS; Frenkel & Goldberger 2021)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _validate


def apply_cts(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Applies class-based temperature scaling: :math:`z_k / T_k`.

    .. math::

        \mathrm{CTS}(z) = (z_1/T_1, \dots, z_K/T_K) \qquad
        \text{(Eq. (15) of [2])}

    **Not accuracy-preserving**: per-class divisors can reorder the logits
    (App. B of [2]).

    Args:
      params: ``{'temperatures': float [K]}`` from :func:`fit_cts`.
      logits: float ``[N, K]``.

    Returns:
      float ``[N, K]`` calibrated logits.

    References:
      [1] L. Frenkel, J. Goldberger, "Network Calibration by Class-based
      Temperature Scaling", EUSIPCO 2021.
      [2] S. Jung et al., "Scaling of Class-wise Training Losses for Post-hoc
      Calibration", ICML 2023, PMLR 202, Eq. (15), App. B.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(apply_cts({"temperatures": jnp.array([2.0, 0.5])},
      ...                 jnp.array([[2.0, 1.0]])))
      [[1. 2.]]
    """
    logits = _core.upcast(logits)
    return apply_cts_params(params, logits)


def apply_cts_params(params, logits):
    """``apply_fn`` of a CTS :class:`~calib_jax.posthoc.Calibrator`."""
    return logits / params["temperatures"].astype(logits.dtype)[None, :]


def check_cts_params(params, *, values: bool = True) -> int:
    """CTS parameters ``{'temperatures': [K]}``, finite and > 0; returns K."""
    arrays = _base.param_arrays(params, {"temperatures": 1})
    k = _base.same_classes(arrays, {"temperatures": (0,)})
    if values:
        _base.check_param_values(
            "params['temperatures']", arrays["temperatures"], positive=True
        )
    return k


def fit_cts(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> dict[str, jax.Array]:
    r"""Fits one temperature per class by NLL (L-BFGS on :math:`\log T_k`).

    .. math::

        \min_{T \in \mathbb{R}_{>0}^K} -\sum_n \omega_n \log
        \mathrm{softmax}\big((z_{nk} / T_k)_k\big)_{y_n},

    from :math:`T_k = 1`, as the experiments of [2] train CTS (NLL, L-BFGS,
    no weight decay). Not accuracy-preserving. A class without samples only
    enters the softmax denominators: its temperature is weakly determined.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: L-BFGS iteration cap (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'temperatures': float32 [K]}``.

    References:
      [1] L. Frenkel, J. Goldberger, EUSIPCO 2021.
      [2] S. Jung et al., ICML 2023, PMLR 202, Eq. (15), Sec. 5.3.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 3))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> fit_cts(z, y)["temperatures"].shape
      (3,)
    """
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    params = _fit(logits, labels, where, tol, max_iter=max_iter)
    _validate.warn_if_suspicious(
        logits, labels, where, name="fit_cts", temperatures=params["temperatures"]
    )
    return params


@jax.jit
def _fit(logits, labels, where, tol, *, max_iter):
    z, labels, w = _core.canonical(logits, labels, where)
    return _train(_init(z), z, labels, w, budget=max_iter, tol=tol)


def _init(z):
    return {"temperatures": jnp.ones(z.shape[-1:], z.dtype)}


def _scaled(log_t, z):
    return z * jnp.exp(-log_t["log_t"])[None, :]


def _train(params, z, labels, weights, *, budget, tol=1e-6):
    log_t = {"log_t": jnp.log(params["temperatures"].astype(z.dtype))}
    log_t = _core.fit_nll_lbfgs(
        _scaled, log_t, z, labels, weights, max_iter=budget, tol=tol
    )
    return {"temperatures": jnp.exp(log_t["log_t"])}


def cts_method(*, max_iter: int = 500, tol: float = 1e-6):
    """CTS (NLL) as a :class:`~calib_jax.posthoc.Method`."""

    def init(logits, labels, weights, key):
        del labels, weights, key
        return _init(logits)

    def train(params, logits, labels, weights, budget):
        return _train(params, logits, labels, weights, budget=budget, tol=tol)

    return _base.Method("cts", init, train, apply_cts_params, max_iter, False)
