r"""Class-wise loss scaling for post-hoc calibration (Jung et al., ICML 2023):
the base calibrator trained on class losses weighted by their normalised size."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _validate


ALPHA0 = 1.0
BETA0 = 1.5
BETA_BOUNDS = (1.5, 2.0)


def normalize_class_losses(class_losses: jax.typing.ArrayLike, present=None):
    r"""ND normalisation of class-wise losses (Eq. (4) / Eq. (9) of [1]).

    .. math::

        \bar{\mathcal L}_{C_i} = \frac{\mathcal L_{C_i} -
        \mathbb E[\mathcal L_C]}{\sqrt{\mathbb E[\mathcal L_C^2] -
        \mathbb E^2[\mathcal L_C]}}

    Mean and (population) standard deviation over the present classes;
    absent classes and a zero spread give 0.

    Args:
      class_losses: float ``[K]`` class-wise losses.
      present: optional bool ``[K]``, classes with at least one sample.

    Returns:
      float ``[K]`` normalised losses.

    References:
      [1] S. Jung, S. Seo, Y. Jeong, J. Choi, "Scaling of Class-wise Training
      Losses for Post-hoc Calibration", ICML 2023, PMLR 202,
      Eq. (4), App. A (Eq. (9)).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(normalize_class_losses(jnp.array([1.0, 2.0, 3.0])).round(4))
      [-1.2247  0.      1.2247]
    """
    x = _core.upcast(class_losses)
    present = jnp.ones(x.shape, bool) if present is None else jnp.asarray(present)
    count = jnp.maximum(jnp.sum(present), 1)
    mean = jnp.sum(jnp.where(present, x, 0.0)) / count
    var = jnp.sum(jnp.where(present, (x - mean) ** 2, 0.0)) / count
    std = jnp.sqrt(var)
    safe = jnp.where(std > 0, std, 1.0)
    return jnp.where(present & (std > 0), (x - mean) / safe, 0.0)


def scaling_weights(
    normalized_losses: jax.typing.ArrayLike,
    alpha: jax.typing.ArrayLike,
    beta: jax.typing.ArrayLike,
) -> jax.Array:
    r"""Class-wise loss scaling weights (Eq. (5) of [1]).

    .. math::

        w_i = \sigma(\bar{\mathcal L}_{C_i}; \alpha, \beta) =
        \frac{\beta}{1 + \exp(-\bar{\mathcal L}_{C_i}/\alpha)} - \frac{\beta}{2}
        \in \Big(-\frac{\beta}{2}, \frac{\beta}{2}\Big)

    (in float32, :math:`w_i = \pm\beta/2` once :math:`|\bar{\mathcal L}/\alpha|
    \gtrsim 17`).

    Args:
      normalized_losses: float ``[K]`` from :func:`normalize_class_losses`.
      alpha: :math:`\alpha > 0` (slope).
      beta: :math:`\beta > 0` (range).

    Returns:
      float ``[K]`` weights; the class loss :math:`i` is multiplied by
      :math:`1 + w_i` (Eq. (8)).

    References:
      [1] S. Jung et al., ICML 2023, PMLR 202, Eq. (5).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(scaling_weights(jnp.array([-1.0, 0.0, 1.0]), 1.0, 1.5).round(4))
      [-0.3466  0.      0.3466]
    """
    x = _core.upcast(normalized_losses)
    return beta * jax.nn.sigmoid(x / alpha) - beta / 2.0


def _weights64(normalized, alpha, beta):
    """Eq. (5) in float64 on the host (strictly inside the interval longer)."""
    x = np.asarray(normalized, np.float64)
    return beta / (1.0 + np.exp(-x / alpha)) - beta / 2.0


def default_alpha_bounds(num_classes: int) -> tuple[float, float]:
    """``(0.1, max(ln(K) / 2, 1))``: the released code's, widened to hold 1."""
    return (0.1, max(math.log(num_classes) / 2.0, 1.0))


def fit_alpha_beta(
    losses_before: np.ndarray,
    losses_after: np.ndarray,
    *,
    present: np.ndarray | None = None,
    alpha0: float = ALPHA0,
    beta0: float = BETA0,
    alpha_bounds: tuple[float, float] | None = None,
    beta_bounds: tuple[float, float] = BETA_BOUNDS,
) -> tuple[float, float]:
    r"""Fits :math:`\alpha, \beta` by SLSQP on Eq. (6) of [1] (host, scipy).

    .. math::

        \min_{\alpha, \beta} \sqrt{\sum_i \Big(\mathcal L^0_{C_i} -
        \sigma(\bar{\mathcal L}^1_{C_i}; \alpha, \beta)\,(\mathcal L^1_{C_i}
        - \mathcal L^0_{C_i}) - \mathbb E[\mathcal L^1_C]\Big)^2}

    Args:
      losses_before: ``[K]`` class losses :math:`\mathcal L^0` at the start.
      losses_after: ``[K]`` class losses :math:`\mathcal L^1` after one iteration.
      present: optional bool ``[K]``; absent classes are left out.
      alpha0, beta0: start (Sec. 5.1 of [1]: 1.0 and 1.5).
      alpha_bounds: ``(lo, hi)``; None = :func:`default_alpha_bounds`.
      beta_bounds: ``(lo, hi)``.

    Returns:
      ``(alpha, beta)`` as floats.

    References:
      [1] S. Jung et al., ICML 2023, PMLR 202, Eq. (6), Sec. 5.1.
    """
    from scipy.optimize import minimize

    l0 = np.asarray(losses_before, np.float64)
    l1 = np.asarray(losses_after, np.float64)
    keep = np.ones(l0.shape, bool) if present is None else np.asarray(present, bool)
    l0, l1 = l0[keep], l1[keep]
    if alpha_bounds is None:
        alpha_bounds = default_alpha_bounds(int(keep.size))
    norm1 = np.asarray(normalize_class_losses(l1), np.float64)
    mean1 = l1.mean()
    delta = l1 - l0

    def objective(x):
        alpha, beta = x
        sigma = _weights64(norm1, alpha, beta)
        return float(np.sqrt(np.sum((l0 - sigma * delta - mean1) ** 2)))

    bounds = (tuple(map(float, alpha_bounds)), tuple(map(float, beta_bounds)))
    x0 = np.clip([alpha0, beta0], [b[0] for b in bounds], [b[1] for b in bounds])
    result = minimize(objective, x0, method="SLSQP", bounds=bounds)
    alpha, beta = (float(v) for v in result.x)
    return alpha, beta


@functools.lru_cache(maxsize=64)
def _compiled(method: _base.Method):
    """Jitted pieces of a method."""

    def class_losses(params, z, labels, weights):
        nll = _core.per_example_nll(method.apply(params, z), labels)
        return _core.class_mean_losses(nll, labels, weights, z.shape[-1])

    return {
        "init": jax.jit(method.init),
        "train": jax.jit(method.train),
        "class_losses": jax.jit(class_losses),
    }


def class_weights_to_sample_weights(class_weights, labels, uniform_weights):
    r"""Per-example weights of :math:`\frac{1}{C}\sum_i (1 + w_i)\mathcal
    L_{C_i}`: :math:`\omega_n = (1 + w_{y_n}) / (C\, n_{y_n})`."""
    k = class_weights.shape[0]
    sizes = _core.class_sizes(labels, uniform_weights, k)
    present = jnp.sum(sizes > 0)
    factor = (1.0 + class_weights) / (jnp.maximum(sizes, 1.0) * present)
    return jnp.where(uniform_weights > 0, factor[labels], 0.0)


def fit_classwise(
    method: _base.Method,
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    seed: int | jax.Array = 0,
    alpha0: float = ALPHA0,
    beta0: float = BETA0,
    alpha_bounds: tuple[float, float] | None = None,
    beta_bounds: tuple[float, float] = BETA_BOUNDS,
    rounds: int = 10,
    weight_tol: float = 1e-4,
) -> tuple[Any, dict[str, Any]]:
    r"""Trains ``method`` with class-wise loss scaling (Eqs. (3)–(8) of [1]).

    The base objective becomes :math:`\sum_i (1 + w_i) \mathcal L_{C_i}` with
    :func:`scaling_weights` of the :func:`normalize_class_losses`;
    :math:`\alpha, \beta` come from :func:`fit_alpha_beta` on the class losses
    before and after one L-BFGS iteration (one Adam step for PTS), then stay
    fixed. As in the released code, :math:`\mathcal L_{C_i}` is the class's
    *mean* NLL (Eq. (3) writes a sum) and the weights act as constants:
    ``rounds`` warm-started fits, each with the previous fit's weights, until
    none moves by more than ``weight_tol``. Host function (SLSQP in SciPy).

    Args:
      method: the base :class:`~calib_jax.posthoc.Method` (TS, ETS, PTS, CTS).
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      seed: initialisation seed (PTS).
      alpha0, beta0: SLSQP start (1.0, 1.5 in [1]).
      alpha_bounds: SLSQP bounds of :math:`\alpha`; None =
        :func:`default_alpha_bounds`.
      beta_bounds: SLSQP bounds of :math:`\beta`.
      rounds: maximum number of weighted fits (fixed-point iterations).
      weight_tol: stop when no class weight changes by more than this.

    Returns:
      ``(params, aux)``: the base method's parameters and a dict with
      ``alpha``, ``beta``, ``class_weights`` (``[K]``, the weights of the
      last fit), ``class_losses`` (``[K]``, class-wise losses of the result)
      and ``rounds`` (fits run).

    References:
      [1] S. Jung et al., ICML 2023, PMLR 202, Eqs. (3)–(8), Sec. 5.1, App. A.
    """
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    rounds = _checks.check_positive_int("rounds", rounds)
    fns = _compiled(method)
    z, labels, uniform = _core.canonical(logits, labels, where)
    k = z.shape[-1]
    present = np.asarray(_core.class_sizes(labels, uniform, k)) > 0

    params = fns["init"](z, labels, uniform, _core.as_key(seed))
    losses0 = np.asarray(fns["class_losses"](params, z, labels, uniform))
    params = fns["train"](params, z, labels, uniform, 1)
    losses1 = np.asarray(fns["class_losses"](params, z, labels, uniform))
    alpha, beta = fit_alpha_beta(
        losses0,
        losses1,
        present=present,
        alpha0=alpha0,
        beta0=beta0,
        alpha_bounds=alpha_bounds,
        beta_bounds=beta_bounds,
    )

    losses = losses1
    previous = None
    fits = 0
    for _ in range(rounds):
        norm = np.asarray(normalize_class_losses(losses, present), np.float64)
        weights = np.where(present, _weights64(norm, alpha, beta), 0.0)
        if previous is not None and np.max(np.abs(weights - previous)) <= weight_tol:
            break
        sample_w = class_weights_to_sample_weights(
            jnp.asarray(weights, z.dtype), labels, uniform
        )
        params = fns["train"](params, z, labels, sample_w, method.budget)
        losses = np.asarray(fns["class_losses"](params, z, labels, uniform))
        previous = weights
        fits += 1
    aux = {
        "alpha": alpha,
        "beta": beta,
        "class_weights": previous,
        "class_losses": losses,
        "rounds": fits,
    }
    return params, aux
