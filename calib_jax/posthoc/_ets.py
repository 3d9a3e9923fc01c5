r"""Ensemble temperature scaling (ETS; Zhang et al. 2020, "Mix-n-Match")."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _temperature, _validate


FORMS = ("original", "logit")


def apply_ets(params, logits: jax.typing.ArrayLike, *, form: str = "original"):
    r"""Applies a fitted ETS map; returns calibrated log-probabilities/logits.

    ``form='original'`` (Zhang et al. 2020) mixes *probabilities*,

    .. math::

        p(z) = w_1\,\mathrm{softmax}(z / T) + w_2\,\mathrm{softmax}(z) +
        w_3\,\tfrac{1}{K}\,\mathbf 1, \qquad w \in \Delta^2,

    and returns :math:`\log p(z)`. ``form='logit'`` is the logit-space form
    of Eq. (13) of [2] and its released code,

    .. math::

        \mathrm{ETS}(z) = w_1 z / T + w_2 z + w_3 / K,

    i.e. temperature scaling with :math:`T_{\mathrm{eff}} = 1/(w_1/T + w_2)`.
    Both preserve the argmax whenever :math:`w_1 + w_2 > 0`.

    Args:
      params: ``{'temperature': T, 'weights': w [3]}`` from :func:`fit_ets_params`.
      logits: float ``[N, K]``.
      form: ``'original'`` or ``'logit'``.

    Returns:
      float ``[N, K]`` calibrated log-probabilities (``'original'``) or logits.

    References:
      [1] J. Zhang, B. Kailkhura, T. Y.-J. Han, "Mix-n-Match: Ensemble and
      Compositional Methods for Uncertainty Calibration in Deep Learning",
      ICML 2020, arXiv:2003.07329 (ensemble temperature scaling).
      [2] S. Jung et al., "Scaling of Class-wise Training Losses for Post-hoc
      Calibration", ICML 2023, PMLR 202, Eq. (13).

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"temperature": jnp.array(2.0), "weights": jnp.array([1.0, 0, 0])}
      >>> out = apply_ets(params, jnp.log(jnp.array([[0.8, 0.2]])))
      >>> print([f"{v:.3f}" for v in out[0]])
      ['-0.405', '-1.099']
    """
    _checks.check_choice("form", form, FORMS)
    logits = _core.upcast(logits)
    fn = _apply_original if form == "original" else _apply_logit
    return fn(params, logits)


def _apply_original(params, logits):
    t = params["temperature"].astype(logits.dtype)
    w = params["weights"].astype(logits.dtype)
    k = logits.shape[-1]
    log_w = jnp.log(w)  # a zero weight gives -inf, which logaddexp handles
    a = log_w[0] + jax.nn.log_softmax(logits / t, axis=-1)
    b = log_w[1] + jax.nn.log_softmax(logits, axis=-1)
    c = log_w[2] - math.log(k)
    return jnp.logaddexp(jnp.logaddexp(a, b), c)


def _apply_logit(params, logits):
    t = params["temperature"].astype(logits.dtype)
    w = params["weights"].astype(logits.dtype)
    k = logits.shape[-1]
    return logits * (w[0] / t + w[1]) + w[2] / k


def check_ets_params(params, *, values: bool = True) -> None:
    """ETS parameters (either form): ``temperature []`` finite and > 0,
    ``weights [3]`` in [0, 1] summing to 1 (any K)."""
    arrays = _base.param_arrays(params, {"temperature": 0, "weights": 1})
    w = arrays["weights"]
    if w.shape != (3,):
        raise ValueError(f"params['weights'] must have shape (3,), got {w.shape}.")
    if values:
        t = arrays["temperature"]
        _base.check_param_values("params['temperature']", t, positive=True)
        _base.check_param_values("params['weights']", w, unit=True)
        total = float(jnp.sum(jnp.asarray(w, jnp.float32)))
        if abs(total - 1.0) > 1e-3:
            raise ValueError(f"params['weights'] must sum to 1, got sum {total:.6g}.")


def fit_ets_params(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    form: str = "original",
    max_iter: int = 100,
    tol: float = 1e-6,
) -> dict[str, jax.Array]:
    r"""Fits ensemble temperature scaling in two stages, both by NLL.

    Stage 1 fits :math:`T` as :func:`fit_temperature` (``objective='nll'``).
    Stage 2 fits the simplex weights :math:`w = \mathrm{softmax}(v)` with
    :math:`T` fixed by L-BFGS on :math:`v` from :math:`w = (1/3, 1/3, 1/3)`,
    minimising the NLL of :func:`apply_ets` (``form``); for ``'original'``:

    .. math::

        \min_{w \in \Delta^2} -\sum_n \omega_n \log\big(w_1
        \mathrm{softmax}(z_n/T)_{y_n} + w_2 \mathrm{softmax}(z_n)_{y_n} +
        w_3/K\big).

    Zhang et al. fit :math:`w` by SLSQP on the simplex; the class-wise
    paper's code leaves :math:`w` free and trains :math:`T, w` jointly in logit
    space. Here :math:`w` stays on the simplex for both forms.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      form: ``'original'`` (probability mixture) or ``'logit'`` ([2]).
      max_iter: L-BFGS iteration cap of each stage (traced).
      tol: gradient tolerance of each stage.

    Returns:
      ``{'temperature': float32 scalar, 'weights': float32 [3]}``.

    References:
      [1] J. Zhang, B. Kailkhura, T. Y.-J. Han, "Mix-n-Match", ICML 2020,
      arXiv:2003.07329 (ensemble temperature scaling).
      [2] S. Jung et al., ICML 2023, PMLR 202, Eq. (13), App. B.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> params = fit_ets_params(z, y)
      >>> print(f"{float(params['weights'].sum()):.3f}")
      1.000
    """
    _checks.check_choice("form", form, FORMS)
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    params = _fit(logits, labels, where, tol, form=form, max_iter=max_iter)
    _validate.warn_if_suspicious(
        logits, labels, where, name="fit_ets_params", temperatures=params["temperature"]
    )
    return params


@functools.partial(jax.jit, static_argnames=("form",))
def _fit(logits, labels, where, tol, *, form, max_iter):
    z, labels, w = _core.canonical(logits, labels, where)
    params = _init(z)
    return _train(params, z, labels, w, budget=max_iter, form=form, tol=tol)


def _init(z):
    return {
        "temperature": jnp.ones((), z.dtype),
        "weights": jnp.full((3,), 1.0 / 3.0, z.dtype),
    }


def _train(params, z, labels, weights, *, budget, form, tol=1e-6):
    u0 = jnp.log(params["temperature"]).astype(z.dtype)
    u = _temperature.fit_log_t_nll(z, labels, weights, u0, max_iter=budget, tol=tol)
    # Weights at 0 would give log 0; the simplex parameterisation needs v finite.
    v0 = jnp.log(jnp.maximum(params["weights"].astype(z.dtype), 1e-12))
    objective = _stage2_objective(z, labels, weights, u, form)
    v, _ = _core.lbfgs_minimize(objective, v0, max_iter=budget, gtol=tol)
    return {"temperature": jnp.exp(u), "weights": jax.nn.softmax(v)}


def _stage2_objective(z, labels, weights, u, form):
    z = jax.lax.stop_gradient(z)
    u = jax.lax.stop_gradient(u)
    if form == "logit":
        nll = _temperature.nll_objective(z, labels, weights)
        t = jnp.exp(u)

        def logit_form(v):
            w = jax.nn.softmax(v)
            # NLL of c * z with c = w1 / T + w2, i.e. TS at log T_eff = -log c.
            return nll(-jnp.log(w[0] / t + w[1]))

        return logit_form

    k = z.shape[-1]
    m = jnp.max(z, axis=-1)
    gap = _core.pick(z, labels) - m  # z_y - max z <= 0
    s = jnp.exp(-u)
    log_p_t = s * gap - jnp.log(_temperature.exp_sums(z, m, s))
    log_p_1 = gap - jnp.log(_temperature.exp_sums(z, m, jnp.ones_like(s)))
    terms = jnp.stack([log_p_t, log_p_1, jnp.full_like(log_p_t, -math.log(k))], -1)

    def original(v):
        mix = jax.nn.logsumexp(jax.nn.log_softmax(v)[None, :] + terms, axis=-1)
        return -jnp.sum(weights * mix)

    return original


def ets_method(*, form: str = "original", max_iter: int = 100, tol: float = 1e-6):
    """ETS (NLL) as a :class:`~calib_jax.posthoc.Method`."""
    _checks.check_choice("form", form, FORMS)

    def init(logits, labels, weights, key):
        del labels, weights, key
        return _init(logits)

    def train(params, logits, labels, weights, budget):
        return _train(
            params, logits, labels, weights, budget=budget, form=form, tol=tol
        )

    return _base.Method("ets", init, train, apply_fn(form), max_iter, True)


def apply_fn(form: str):
    """The static ``apply_fn`` of an ETS calibrator of the given form."""
    return _apply_original if form == "original" else _apply_logit
