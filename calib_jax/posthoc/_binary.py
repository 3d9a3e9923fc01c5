r"""Binary calibrators (K = 2): Platt scaling and Beta calibration, logistic
regressions on the logit difference :math:`d = z_1 - z_0` by damped Newton."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _validate

BINARY_ONLY = ("platt", "beta")


def check_binary(name: str, logits) -> None:
    """One-line ValueError unless ``logits`` has K = 2 columns."""
    k = jnp.shape(logits)[-1]
    if k != 2:
        raise ValueError(
            f"{name!r} is a binary calibrator: it needs K = 2 classes, got K = {k} "
            "(for K > 2 use e.g. 'ts', 'histogram_binning' or 'isotonic')."
        )


def _difference(logits):
    return logits[:, 1] - logits[:, 0]


def _log_probs(f):
    """``[log(1 - sigmoid(f)), log(sigmoid(f))]``, ``[N, 2]``."""
    return jnp.stack([jax.nn.log_sigmoid(-f), jax.nn.log_sigmoid(f)], axis=-1)


def _logistic_loss(beta, x, target, weights):
    f = x @ beta
    # -t log sigmoid(f) - (1 - t) log sigmoid(-f) = softplus(f) - t f
    return jnp.sum(weights * (jax.nn.softplus(f) - target * f))


def logistic_newton(x, target, weights, beta0, free, *, max_iter, tol):
    r"""``beta [P]`` minimising :math:`\sum_n \omega_n (\log(1 + e^{f_n}) - t_n
    f_n)`, :math:`f = X\beta` (``x [N, P]``, ``target [N]`` in [0, 1]), over the
    ``free`` coordinates from ``beta0``. Each step solves :math:`(H + 10^{-9}
    \mathrm{tr} H\, I)\delta = g` (a singular Hessian stays solvable) and is
    halved until the loss does not increase; stops after ``max_iter``, at
    :math:`\max|g| \le` ``tol`` or a step below ``1e-7 (1 + max|beta|)``."""
    p = beta0.shape[0]
    mask = free.astype(x.dtype)
    loss = functools.partial(_logistic_loss, x=x, target=target, weights=weights)

    def grad_hess(beta):
        s = jax.nn.sigmoid(x @ beta)
        g = x.T @ (weights * (s - target))
        h = (x * (weights * s * (1.0 - s))[:, None]).T @ x
        g = g * mask
        h = h * mask[:, None] * mask[None, :] + jnp.diag(1.0 - mask)
        return g, h

    def cond(carry):
        _, it, done = carry
        return (it < max_iter) & ~done

    def body(carry):
        beta, it, _ = carry
        g, h = grad_hess(beta)
        damp = 1e-9 * jnp.trace(h) + 1e-30
        step = jnp.linalg.solve(h + damp * jnp.eye(p, dtype=h.dtype), g)
        old = loss(beta)

        def shrink(c):
            a, _ = c
            return a * 0.5, loss(beta - 0.5 * a * step)

        def too_big(c):
            a, new = c
            return (new > old) & (a > 2.0**-30)

        a, new = lax.while_loop(
            too_big, shrink, (jnp.ones((), x.dtype), loss(beta - step))
        )
        ok = new <= old
        delta = jnp.where(ok, a, 0.0) * step
        beta_new = beta - delta
        small = jnp.max(jnp.abs(delta)) <= 1e-7 * (1.0 + jnp.max(jnp.abs(beta_new)))
        done = (jnp.max(jnp.abs(g)) <= tol) | small | ~ok
        return beta_new, it + 1, done

    carry = (beta0, jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    beta, _, _ = lax.while_loop(cond, body, carry)
    return beta


def _weights_and_targets(logits, labels, where):
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    mask = jnp.ones(labels.shape, bool) if where is None else jnp.asarray(where, bool)
    d = jnp.where(mask, _difference(logits), 0.0)
    weights = _core.mask_weights(mask, d.dtype)
    y = (labels == 1).astype(d.dtype)
    return d, y, mask, weights


def apply_platt_params(params, logits):
    """``apply_fn`` of Platt scaling (log-probabilities ``[N, 2]``)."""
    a = params["a"].astype(logits.dtype)
    b = params["b"].astype(logits.dtype)
    return _log_probs(a * _difference(logits) + b)


def check_platt_params(params, *, values: bool = True) -> int:
    """Platt parameters ``{'a': [], 'b': []}``, finite; binary (K = 2)."""
    arrays = _base.param_arrays(params, {"a": 0, "b": 0})
    for key, leaf in arrays.items() if values else ():
        _base.check_param_values(f"params[{key!r}]", leaf)
    return 2


def apply_platt(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Applies Platt scaling: :math:`q = \sigma(a (z_1 - z_0) + b)`.

    Args:
      params: ``{'a': scalar, 'b': scalar}`` from :func:`fit_platt`.
      logits: float ``[N, 2]``.

    Returns:
      float ``[N, 2]`` log-probabilities ``[log(1 - q), log(q)]``.

    Raises:
      ValueError: K != 2.

    References:
      [1] J. Platt, "Probabilistic Outputs for Support Vector Machines and
      Comparisons to Regularized Likelihood Methods", Advances in Large
      Margin Classifiers, MIT Press 1999, Eq. (1).

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"a": jnp.array(0.5), "b": jnp.array(0.0)}
      >>> q = jnp.exp(apply_platt(params, jnp.array([[0.0, 2.0]])))
      >>> print([f"{v:.4f}" for v in q[0]])
      ['0.2689', '0.7311']
    """
    logits = _core.upcast(logits)
    check_binary("platt", logits)
    return apply_platt_params(params, logits)


def fit_platt(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    target_smoothing: bool = True,
    max_iter: int = 100,
    tol: float = 1e-7,
) -> dict[str, jax.Array]:
    r"""Fits Platt scaling (K = 2): logistic regression on :math:`z_1 - z_0`.

    .. math::

        q(z) = \sigma\big(a\,(z_1 - z_0) + b\big), \qquad
        \min_{a, b} \sum_n \omega_n \big(\log(1 + e^{f_n}) - t_n f_n\big),
        \quad f_n = a d_n + b,

    the model of [1] (Eq. (1), :math:`a = -A`) on :math:`d = z_1 - z_0`
    instead of an SVM output. With ``target_smoothing`` ([1], Eq. (3)) the
    targets are :math:`t_+ = (N_+ + 1)/(N_+ + 2)` for class 1 and :math:`t_- =
    1/(N_- + 2)` for class 0, which keeps :math:`a, b` finite on separable
    data; without it, :math:`t_n = y_n`. Damped Newton from the identity.

    Args:
      logits: float ``[N, 2]``.
      labels: int ``[N]`` in ``{0, 1}``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      target_smoothing: static; Platt's smoothed targets (True) or 0/1.
      max_iter: Newton iteration cap (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'a': float32 scalar, 'b': float32 scalar}``.

    Raises:
      ValueError: K != 2, bad shapes; for concrete inputs NaN/inf logits or
        labels out of range (one line).

    References:
      [1] J. Platt, Advances in Large Margin Classifiers, MIT Press 1999,
      Eqs. (1)-(3).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = jnp.stack([jnp.zeros(512), 3.0 * jax.random.normal(jax.random.key(0), (512,))], 1)
      >>> y = jax.random.bernoulli(jax.random.key(1), jax.nn.sigmoid(z[:, 1] / 3.0)).astype(jnp.int32)
      >>> print(f"{float(fit_platt(z, y)['a']):.2f}")
      0.34
    """
    check_binary("platt", logits)
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    params = _fit_platt(
        logits, labels, where, tol, max_iter=max_iter, smoothing=bool(target_smoothing)
    )
    _validate.warn_if_suspicious(logits, labels, where, name="platt")
    return params


@functools.partial(jax.jit, static_argnames="smoothing")
def _fit_platt(logits, labels, where, tol, *, max_iter, smoothing):
    d, y, mask, weights = _weights_and_targets(logits, labels, where)
    if smoothing:
        n_pos = jnp.sum(jnp.where(mask, y, 0.0))
        n_neg = jnp.sum(mask.astype(d.dtype)) - n_pos
        y = jnp.where(y > 0, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    x = jnp.stack([d, jnp.ones_like(d)], axis=1)
    beta0 = jnp.array([1.0, 0.0], d.dtype)
    beta = logistic_newton(
        x, y, weights, beta0, jnp.ones(2, bool), max_iter=max_iter, tol=tol
    )
    return {"a": beta[0].astype(jnp.float32), "b": beta[1].astype(jnp.float32)}


def _beta_features(d):
    """``[ln s, -ln(1 - s), 1]`` with ``s = sigmoid(d)`` (no clipping)."""
    return jnp.stack(
        [jax.nn.log_sigmoid(d), -jax.nn.log_sigmoid(-d), jnp.ones_like(d)], axis=1
    )


def apply_beta_params(params, logits):
    """``apply_fn`` of Beta calibration (log-probabilities ``[N, 2]``)."""
    x = _beta_features(_difference(logits))
    beta = jnp.stack([params["a"], params["b"], params["c"]]).astype(logits.dtype)
    return _log_probs(x @ beta)


def check_beta_params(params, *, values: bool = True) -> int:
    """Beta parameters ``{'a', 'b', 'c'}`` (scalars), finite; binary (K = 2)."""
    arrays = _base.param_arrays(params, {"a": 0, "b": 0, "c": 0})
    for key, leaf in arrays.items() if values else ():
        _base.check_param_values(f"params[{key!r}]", leaf)
    return 2


def apply_beta(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Applies Beta calibration: :math:`q = \sigma(a \ln s - b \ln(1 - s) +
    c)`, :math:`s = \mathrm{softmax}(z)_1`.

    Args:
      params: ``{'a', 'b', 'c'}`` scalars from :func:`fit_beta`.
      logits: float ``[N, 2]``.

    Returns:
      float ``[N, 2]`` log-probabilities ``[log(1 - q), log(q)]``.

    Raises:
      ValueError: K != 2.

    References:
      [1] M. Kull, T. Silva Filho, P. Flach, "Beta calibration: a well-founded
      and easily implemented improvement on logistic calibration for binary
      classifiers", AISTATS 2017, PMLR 54, Eqs. (1)-(3).

    Examples:
      >>> import jax.numpy as jnp
      >>> params = {"a": jnp.array(1.0), "b": jnp.array(1.0), "c": jnp.array(0.0)}
      >>> q = jnp.exp(apply_beta(params, jnp.array([[0.0, 2.0]])))
      >>> print([f"{v:.4f}" for v in q[0]])
      ['0.1192', '0.8808']
    """
    logits = _core.upcast(logits)
    check_binary("beta", logits)
    return apply_beta_params(params, logits)


def fit_beta(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 100,
    tol: float = 1e-7,
) -> dict[str, jax.Array]:
    r"""Fits Beta calibration (K = 2, the three-parameter family of [1]).

    .. math::

        q(s) = \frac{1}{1 + 1/\big(e^{c}\, s^{a} / (1 - s)^{b}\big)}
             = \sigma\big(a \ln s - b \ln(1 - s) + c\big),

    :math:`s = \mathrm{softmax}(z)_1`, by logistic regression of :math:`y` on
    :math:`(\ln s, -\ln(1 - s))` (Sec. 3 of [1]). As in [1], a fit with
    :math:`a < 0` is redone with :math:`a = 0`, else one with :math:`b < 0`
    with :math:`b = 0`. :math:`\ln s = \log\sigma(z_1 - z_0)` needs no
    clipping. Damped Newton from the identity (:math:`a = b = 1, c = 0`).

    Args:
      logits: float ``[N, 2]``.
      labels: int ``[N]`` in ``{0, 1}``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: Newton iteration cap per fit (traced).
      tol: gradient max-norm tolerance.

    Returns:
      ``{'a', 'b', 'c'}``: float32 scalars.

    Raises:
      ValueError: K != 2, bad shapes; for concrete inputs NaN/inf logits or
        labels out of range (one line).

    References:
      [1] M. Kull, T. Silva Filho, P. Flach, AISTATS 2017, PMLR 54, Sec. 3 (the
      fit and the refit when a parameter is negative).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = jnp.stack([jnp.zeros(512), 3.0 * jax.random.normal(jax.random.key(0), (512,))], 1)
      >>> y = jax.random.bernoulli(jax.random.key(1), jax.nn.sigmoid(z[:, 1] / 3.0)).astype(jnp.int32)
      >>> sorted(fit_beta(z, y))
      ['a', 'b', 'c']
    """
    check_binary("beta", logits)
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    params = _fit_beta(logits, labels, where, tol, max_iter=max_iter)
    _validate.warn_if_suspicious(logits, labels, where, name="beta")
    return params


@jax.jit
def _fit_beta(logits, labels, where, tol, *, max_iter):
    d, y, _, weights = _weights_and_targets(logits, labels, where)
    x = _beta_features(d)

    def fit(beta0, free):
        return logistic_newton(
            x,
            y,
            weights,
            jnp.asarray(beta0, d.dtype),
            jnp.asarray(free),
            max_iter=max_iter,
            tol=tol,
        )

    full = fit([1.0, 1.0, 0.0], [True, True, True])
    no_a = fit([0.0, 1.0, 0.0], [False, True, True])
    no_b = fit([1.0, 0.0, 0.0], [True, False, True])
    beta = jnp.where(full[0] < 0, no_a, jnp.where(full[1] < 0, no_b, full))
    return {k: beta[i].astype(jnp.float32) for i, k in enumerate("abc")}
