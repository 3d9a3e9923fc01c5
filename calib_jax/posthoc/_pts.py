r"""Parameterized temperature scaling (PTS; Tomani et al. 2022)."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import optax

from calib_jax import _checks
from calib_jax.posthoc import _base, _core, _temperature, _validate


LOSSES = ("nll", "brier")
# Floor of the per-sample temperature |h(z)|: keeps z / T finite where the
# network output crosses 0 (the paper's |.| alone has a pole there).
MIN_TEMPERATURE = 1e-2


def _features(logits, top_k):
    """Top-k logits sorted in decreasing order, ``[N, top_k]``."""
    return jax.lax.top_k(logits, top_k)[0]


def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b[None, :])
    w, b = params[-1]
    return (x @ w + b[None, :])[:, 0]


def sample_temperatures(params, logits: jax.Array) -> jax.Array:
    r"""Per-sample temperatures :math:`T_n = \max(|h_\theta(z_{n,(1:k)})|,
    10^{-2})`, ``[N]``."""
    top_k = params[0][0].shape[0]
    return _temperatures(params, _features(logits, top_k))


def _temperatures(params, features):
    return jnp.maximum(jnp.abs(_mlp(params, features)), MIN_TEMPERATURE)


def apply_pts(params, logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Applies a fitted PTS map: :math:`z_n / T_n` with :math:`T_n =
    h_\theta(\mathrm{top}_k(z_n))` (accuracy-preserving).

    .. math::

        \mathrm{PTS}(z) = \frac{z}{h_\theta(z_s)} \qquad
        \text{(Eq. (14) of [2])},

    :math:`z_s` the top-:math:`k` logits sorted in decreasing order and
    :math:`h_\theta` a small ReLU MLP with one output, made positive by its
    absolute value as in [1] and floored at 0.01.

    Args:
      params: MLP parameters from :func:`fit_pts`, a list of ``(W, b)``.
      logits: float ``[N, K]``.

    Returns:
      float ``[N, K]`` calibrated logits.

    References:
      [1] C. Tomani, D. Cremers, F. Buettner, "Parameterized Temperature
      Scaling for Boosting the Expressive Power in Post-Hoc Uncertainty
      Calibration", ECCV 2022, arXiv:2102.12182 (method and setup).
      [2] S. Jung et al., ICML 2023, PMLR 202, Eq. (14).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (256, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> params = fit_pts(z, y, steps=50)
      >>> bool((apply_pts(params, z).argmax(1) == z.argmax(1)).all())
      True
    """
    return apply_pts_params(params, _core.upcast(logits))


def fit_pts(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    top_k: int = 10,
    hidden: tuple[int, ...] = (5, 5),
    steps: int = 1000,
    learning_rate: float = 1e-2,
    weight_decay: float = 0.0,
    loss: str = "nll",
    seed: int | jax.Array = 0,
) -> list[tuple[jax.Array, jax.Array]]:
    r"""Fits parameterized temperature scaling with full-batch Adam.

    :math:`h_\theta`: input the ``top_k`` largest logits (``min(top_k, K)``),
    ReLU hidden layers of widths ``hidden``, one linear output; [1]'s
    defaults (top 10 logits, two hidden layers of 5 units). Hidden weights are
    He-normal, biases 0; the output layer starts at weight 0 and bias 1, so
    training starts from the identity map (:math:`T_n = 1`). Trained for a
    fixed number of ``steps`` of Adam (``optax.adamw`` when ``weight_decay >
    0``) on the whole (weighted) set inside ``lax.fori_loop``, minimising

    .. math::

        \sum_n \omega_n \ell\big(\mathrm{softmax}(z_n / T_n), y_n\big),

    with :math:`\ell` the NLL (``loss='nll'``, as in the class-wise paper's
    experiments) or the squared error to the one-hot label (``'brier'``, the
    MSE loss of [1]). [1] trains with mini-batches of 1000, learning rate
    5e-5 and 1e5 steps; full-batch Adam at 1e-2 for 1000 steps is this
    library's default.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      top_k: static number of sorted logits fed to the network.
      hidden: static hidden-layer widths.
      steps: number of Adam steps (traced: changing it does not recompile).
      learning_rate: Adam learning rate.
      weight_decay: decoupled weight decay (0 = plain Adam).
      loss: ``'nll'`` or ``'brier'``.
      seed: int or PRNG key for the initialisation (vmappable as a key).

    Returns:
      The MLP parameters, a list of ``(W [d_in, d_out], b [d_out])``.

    References:
      [1] C. Tomani, D. Cremers, F. Buettner, ECCV 2022, arXiv:2102.12182
      (method, network and training setup).
      [2] S. Jung et al., ICML 2023, PMLR 202, Eq. (14), Sec. 5.3.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (256, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> [w.shape for w, _ in fit_pts(z, y, steps=10)]
      [(4, 5), (5, 5), (5, 1)]
    """
    _checks.check_choice("loss", loss, LOSSES)
    logits, labels, where = _validate.check_inputs(logits, labels, where)
    top_k = min(_checks.check_positive_int("top_k", top_k), logits.shape[1])
    hidden = tuple(_checks.check_positive_int("hidden", h) for h in hidden)
    steps = _checks.check_positive_int("steps", steps)
    _validate.check_nonnegative("weight_decay", weight_decay)
    key = _core.as_key(seed)
    params = _fit(
        logits,
        labels,
        where,
        key,
        learning_rate,
        weight_decay,
        top_k=top_k,
        hidden=hidden,
        steps=steps,
        loss=loss,
    )
    _validate.warn_if_suspicious(logits, labels, where, name="fit_pts")
    return params


@functools.partial(jax.jit, static_argnames=("top_k", "hidden", "loss"))
def _fit(logits, labels, where, key, lr, wd, *, top_k, hidden, steps, loss):
    z, labels, w = _core.canonical(logits, labels, where)
    params = init_params(key, top_k, hidden, z.dtype)
    return _train(params, z, labels, w, steps=steps, lr=lr, wd=wd, loss=loss)


def init_params(key, top_k, hidden, dtype=jnp.float32):
    """He-normal hidden layers; output layer ``W = 0, b = 1`` (``T = 1``)."""
    sizes = (top_k, *hidden)
    keys = jax.random.split(key, len(hidden))
    params = []
    for k, (d_in, d_out) in zip(keys, itertools.pairwise(sizes)):
        scale = jnp.sqrt(2.0 / d_in).astype(dtype)
        params.append(
            (
                scale * jax.random.normal(k, (d_in, d_out), dtype),
                jnp.zeros(d_out, dtype),
            )
        )
    params.append((jnp.zeros((sizes[-1], 1), dtype), jnp.ones((1,), dtype)))
    return params


def _loss_fn(z, labels, weights, loss, top_k):
    # The sorted top-k logits do not depend on the parameters: computed once.
    features = _features(z, top_k)
    if loss == "nll":
        nll = _temperature.nll_objective(z, labels, weights)
        return lambda p: nll(jnp.log(_temperatures(p, features)))
    onehot = jax.nn.one_hot(labels, z.shape[-1], dtype=z.dtype)

    def brier(p):
        probs = jax.nn.softmax(z / _temperatures(p, features)[:, None], axis=-1)
        return jnp.sum(weights * jnp.sum((probs - onehot) ** 2, axis=-1))

    return brier


def _train(params, z, labels, weights, *, steps, lr, wd, loss):
    z = jax.lax.stop_gradient(z)
    objective = _loss_fn(z, labels, weights, loss, params[0][0].shape[0])
    tx = optax.adamw(lr, weight_decay=wd)  # wd = 0: plain Adam

    def step(_, carry):
        p, state = carry
        grads = jax.grad(objective)(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    params, _ = jax.lax.fori_loop(0, steps, step, (params, tx.init(params)))
    return params


def pts_method(
    *,
    top_k: int = 10,
    hidden: tuple[int, ...] = (5, 5),
    steps: int = 1000,
    learning_rate: float = 1e-2,
    weight_decay: float = 0.0,
):
    """PTS with the NLL loss as a :class:`~calib_jax.posthoc.Method`."""

    def init(logits, labels, weights, key):
        del labels, weights
        return init_params(
            key, min(top_k, logits.shape[1]), tuple(hidden), logits.dtype
        )

    def train(params, logits, labels, weights, budget):
        return _train(
            params,
            logits,
            labels,
            weights,
            steps=budget,
            lr=learning_rate,
            wd=weight_decay,
            loss="nll",
        )

    return _base.Method("pts", init, train, apply_pts_params, steps, True)


def apply_pts_params(params, logits):
    """``apply_fn`` of a PTS :class:`~calib_jax.posthoc.Calibrator`."""
    return logits / sample_temperatures(params, logits)[:, None]


def check_pts_params(params, *, values: bool = True) -> None:
    """PTS parameters: finite ``(w [d_in, d_out], b [d_out])`` layers that
    chain into one output (any K >= the first ``d_in``)."""
    if not isinstance(params, (list, tuple)) or not params:
        got = "an empty list" if isinstance(params, (list, tuple)) else "a "
        got += "" if isinstance(params, (list, tuple)) else type(params).__name__
        raise ValueError(
            f"params must be a non-empty list of (w, b) layers, got {got}."
        )
    width = None
    for i, layer in enumerate(params):
        if not isinstance(layer, (list, tuple)) or len(layer) != 2:
            raise ValueError(f"params[{i}] must be a (w, b) pair.")
        w = _base.param_array(layer[0], f"params[{i}][0]", 2)
        b = _base.param_array(layer[1], f"params[{i}][1]", 1)
        d_out = 1 if i == len(params) - 1 else w.shape[1]
        if (
            (width is not None and w.shape[0] != width)
            or w.shape[1] != d_out
            or (b.shape != (d_out,))
        ):
            raise ValueError(
                f"params[{i}] has shapes {w.shape}, {b.shape}: the layers do not "
                "chain into one temperature per row."
            )
        width = d_out
        if values:
            _base.check_param_values(f"params[{i}][0]", w)
            _base.check_param_values(f"params[{i}][1]", b)
