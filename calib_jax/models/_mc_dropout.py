r"""MC dropout: test-time dropout samples of a trained model and their average.

Gal and Ghahramani (2016) read a network trained with dropout as a variational
approximation of a Bayesian network: keeping dropout on at test time and
averaging the softmax of ``S`` stochastic forward passes estimates the
predictive distribution, and the spread of the samples estimates the model
(epistemic) uncertainty.

Here the dropout layers (every ``flax.linen.Dropout`` of the model with a
positive rate) are sampled while everything else runs in inference mode: the
model is applied with ``train=False``, so BatchNorm layers normalise with
their running averages, and a flax method interceptor
(``flax.linen.intercept_methods``) draws each dropout layer's mask exactly
as ``nn.Dropout`` does in training (same rng stream, same Bernoulli draw,
same ``1 / (1 - rate)`` scaling). No model changes: any model whose dropout
layers are ``nn.Dropout`` works (MLP, CNN and the wide ResNets here), and a
model built with ``dropout_rate=0`` has no dropout layer, so its outputs,
parameters and checkpoints are those of a model without the option.

Randomness is per row: the ``S`` samples of row ``i`` use the keys
``jax.random.split(jax.random.fold_in(key, first_row + i), S)``. The dropout
masks of a row therefore depend only on ``key`` and the row's position in its
set, not on the batch size, the batch boundaries, padding or the sharding: a
set evaluated in batches with ``first_row`` = each batch's offset gets the
same samples as one call on the whole set (up to the float rounding of
another batch shape, about 1e-7 relative).

References:
  [1] Y. Gal, Z. Ghahramani, "Dropout as a Bayesian Approximation:
      Representing Model Uncertainty in Deep Learning", ICML 2016,
      arXiv:1506.02142v6, Sec. 3 (dropout training as approximate inference)
      and Sec. 4 (the Monte Carlo estimate of the predictive distribution
      from ``T`` stochastic forward passes, "MC dropout").
  [2] Y. Gal, "Uncertainty in Deep Learning", PhD thesis, University of
      Cambridge, 2016, Sec. 3.3.1 (predictive entropy and mutual information
      of the MC-dropout samples).
  [3] N. Houlsby, F. Huszár, Z. Ghahramani, M. Lengyel, "Bayesian Active
      Learning for Classification and Preference Learning",
      arXiv:1112.5745v1, Sec. 2 (BALD, the mutual information).
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


class MCDropoutPrediction(NamedTuple):
    """The MC-dropout prediction of ``N`` rows.

    Attributes:
      logits: float32 ``[N, K]``, the log of the mean of the samples' softmax
        probabilities (``softmax(logits)`` is that mean).
      mutual_information: float32 ``[N]``, ``H(mean_s p_s) - mean_s H(p_s)``.
    """

    logits: jax.Array
    mutual_information: jax.Array


def _sampled_dropout(found: list):
    """An interceptor that applies every ``nn.Dropout`` call stochastically.

    The mask is drawn as ``flax.linen.Dropout.__call__`` draws it when not
    deterministic (the layer's own rng stream, ``bernoulli(keep)``, inputs
    scaled by ``1 / keep``), whatever ``deterministic`` the model passes.
    Each sampled layer's path is appended to ``found`` (at trace time).
    """

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if not (isinstance(module, nn.Dropout) and context.method_name == "__call__"):
            return next_fun(*args, **kwargs)
        inputs = args[0]
        if module.rate == 0.0:
            return inputs
        found.append(module.path)
        if module.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep = 1.0 - module.rate
        rng = kwargs.get("rng", args[2] if len(args) > 2 else None)
        if rng is None:
            rng = module.make_rng(module.rng_collection)
        shape = list(inputs.shape)
        for dim in module.broadcast_dims:
            shape[dim] = 1
        mask = jnp.broadcast_to(
            jax.random.bernoulli(rng, p=keep, shape=shape), inputs.shape
        )
        return lax.select(mask, inputs / keep, jnp.zeros_like(inputs))

    return interceptor


def _name(model) -> str:
    rate = getattr(model, "dropout_rate", None)
    rate = "" if rate is None else f" (dropout_rate={rate})"
    return f"{type(model).__name__}{rate}"


def _no_dropout(model, num_samples) -> ValueError:
    return ValueError(
        f"mc_dropout num_samples={num_samples} needs a model with dropout, but "
        f"{_name(model)} has no dropout layer; build it with dropout_rate > 0 "
        "(calib_jax.models.DROPOUT_MODELS lists the models with that option)."
    )


def count_dropout_layers(model: nn.Module, images: jax.typing.ArrayLike) -> int:
    """The number of dropout layers with a positive rate a forward pass applies.

    Traced with ``jax.eval_shape`` (nothing is computed or compiled), so it is
    cheap enough to check a config before any work.

    Args:
      model: a flax module called as ``model(x, train=False)``.
      images: float ``[B, ...]`` input (a ``jax.ShapeDtypeStruct`` works).

    Returns:
      The number of ``nn.Dropout`` calls with ``0 < rate`` in one forward pass.
    """
    found: list = []
    rng = jax.random.key(0)

    def init(x):
        with nn.intercept_methods(_sampled_dropout(found)):
            return model.init({"params": rng, "dropout": rng}, x, train=False)

    jax.eval_shape(init, images)
    return len(found)


def _check_num_samples(num_samples) -> int:
    if (
        isinstance(num_samples, bool)
        or not isinstance(num_samples, numbers.Integral)
        or num_samples < 1
    ):
        raise ValueError(
            f"num_samples must be a positive int (the MC-dropout samples), got "
            f"{num_samples!r}."
        )
    return int(num_samples)


@functools.partial(jax.jit, static_argnames=("model", "num_samples"))
def _samples(model, variables, images, key, first_row, num_samples):
    n = images.shape[0]
    rows = jnp.asarray(first_row, jnp.uint32) + jnp.arange(n, dtype=jnp.uint32)
    row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)
    keys = jax.vmap(lambda k: jax.random.split(k, num_samples))(row_keys)  # [N, S]
    found: list = []

    def one(x, k):  # one row, one sample: [K]
        with nn.intercept_methods(_sampled_dropout(found)):
            out = model.apply(variables, x[None], train=False, rngs={"dropout": k})
        return out[0].astype(jnp.float32)

    per_row = jax.vmap(one, in_axes=(None, 0))  # over samples: [S, K]
    logits = jax.vmap(per_row, in_axes=(0, 0), out_axes=1)(images, keys)  # [S, N, K]
    if not found:
        raise _no_dropout(model, num_samples)
    return logits


def mc_dropout_logits(
    model: nn.Module,
    variables,
    images: jax.typing.ArrayLike,
    *,
    key: jax.Array,
    num_samples: int,
    first_row: jax.typing.ArrayLike = 0,
) -> jax.Array:
    r"""Logits of ``num_samples`` test-time dropout samples, ``[S, N, K]``.

    Sample :math:`s` is the model's forward pass with fresh dropout masks
    :math:`\hat W_s \sim q(W)` ([1] Sec. 4) and BatchNorm on its running
    averages (``train=False``); all ``S`` samples are computed in one jitted
    call (``vmap`` over the samples' keys). Row ``i``'s samples use the keys
    ``split(fold_in(key, first_row + i), S)``, so they do not depend on the
    batch a row is evaluated in (see the module docstring). Memory is that of
    a forward pass over ``S * N`` rows.

    Args:
      model: a flax module with dropout layers (e.g. ``MLP(dropout_rate=0.2)``),
        called as ``model(x, train=False)``. Static.
      variables: its variables (``params``, and ``batch_stats`` if any).
      images: float ``[N, ...]`` model inputs (preprocessed as in training).
      key: a PRNG key.
      num_samples: static positive int ``S``.
      first_row: int, the position of ``images[0]`` in its set (traceable).

    Returns:
      float32 ``[S, N, K]``.

    Raises:
      ValueError: ``num_samples`` is not a positive int, or ``model`` has no
        dropout layer with a positive rate (one line naming the model and its
        rate; raised at trace time, so also under ``jax.jit``).

    References:
      [1] Y. Gal, Z. Ghahramani, ICML 2016, arXiv:1506.02142v6, Sec. 4.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import models
      >>> model = models.MLP(num_classes=3, hidden=(8,), dropout_rate=0.5)
      >>> x = jnp.ones((2, 4))
      >>> variables = model.init(jax.random.key(0), x)
      >>> z = models.mc_dropout_logits(
      ...     model, variables, x, key=jax.random.key(1), num_samples=5)
      >>> z.shape
      (5, 2, 3)
    """
    num_samples = _check_num_samples(num_samples)
    images = jnp.asarray(images)
    if images.ndim < 2:
        raise ValueError(
            f"images must have a batch axis ([N, ...]), got shape {images.shape}."
        )
    return _samples(model, variables, images, key, first_row, num_samples)


@jax.jit
def _average(sample_logits):
    z = sample_logits.astype(jnp.promote_types(sample_logits.dtype, jnp.float32))
    log_p = jax.nn.log_softmax(z, axis=-1)  # [S, N, K]
    # log of the mean sample probability, log (1/S) sum_s p_s, in log space.
    log_mean = jax.nn.logsumexp(log_p, axis=0) - jnp.log(float(z.shape[0]))

    def entropy(lp):  # -sum_k p_k log p_k with 0 log 0 = 0
        p = jnp.exp(lp)
        return -jnp.sum(jnp.where(p > 0, p * lp, 0.0), axis=-1)

    # Jensen: H(mean p) >= mean H(p); the clamp removes rounding below 0.
    mi = jnp.maximum(entropy(log_mean) - jnp.mean(entropy(log_p), axis=0), 0.0)
    return MCDropoutPrediction(log_mean.astype(jnp.float32), mi.astype(jnp.float32))


def mc_dropout_average(sample_logits: jax.typing.ArrayLike) -> MCDropoutPrediction:
    r"""The MC-dropout prediction and mutual information of sample logits.

    With :math:`p_s = \mathrm{softmax}(z_s)` the ``S`` samples' probabilities,
    the predictive distribution is their mean ([1] Sec. 4) and the mutual
    information between the prediction and the weights (BALD, [3] Sec. 2;
    estimated from the samples as in [2] Sec. 3.3.1) is

    .. math::

        \bar p = \frac1S \sum_s p_s, \qquad
        \mathrm{MI} = H[\bar p] - \frac1S \sum_s H[p_s] \ge 0.

    The logits returned are :math:`\log \bar p`, formed in log space as
    ``logsumexp_s(log_softmax(z_s)) - log S`` (no underflow of tiny
    probabilities), so ``softmax(logits) == mean_s softmax(z_s)`` and every
    metric or calibrator that takes logits takes the MC-dropout prediction.
    MI rounding below 0 is clamped to 0. A per-row function: rows are
    independent (no sum over examples, so nothing to merge).

    Args:
      sample_logits: float ``[S, N, K]`` (e.g. :func:`mc_dropout_logits`; any
        float dtype, computed in at least float32).

    Returns:
      :class:`MCDropoutPrediction` of float32 ``logits [N, K]`` and
      ``mutual_information [N]``.

    Raises:
      ValueError: ``sample_logits`` is not of rank 3.

    References:
      [1] Y. Gal, Z. Ghahramani, ICML 2016, arXiv:1506.02142v6, Sec. 4.
      [2] Y. Gal, PhD thesis, Cambridge 2016, Sec. 3.3.1.
      [3] N. Houlsby et al., arXiv:1112.5745v1, Sec. 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import models
      >>> z = jnp.array([[[3.0, 0.0]], [[0.0, 3.0]]])  # two samples disagree
      >>> out = models.mc_dropout_average(z)
      >>> print(jnp.exp(out.logits), round(float(out.mutual_information[0]), 4))
      [[0.5 0.5]] 0.5023
    """
    z = jnp.asarray(sample_logits)
    if z.ndim != 3:
        raise ValueError(
            f"sample_logits must be [S, N, K] (samples, rows, classes), got shape "
            f"{z.shape}."
        )
    return _average(z)


def mc_dropout_predict(
    model: nn.Module,
    variables,
    images: jax.typing.ArrayLike,
    *,
    key: jax.Array,
    num_samples: int,
    first_row: jax.typing.ArrayLike = 0,
) -> MCDropoutPrediction:
    """:func:`mc_dropout_average` of :func:`mc_dropout_logits` (one call).

    Args, Raises: as :func:`mc_dropout_logits`.

    Returns:
      :class:`MCDropoutPrediction`: float32 ``logits [N, K]`` (log of the
      mean sample probability) and ``mutual_information [N]``.

    References:
      [1] Y. Gal, Z. Ghahramani, ICML 2016, arXiv:1506.02142v6, Sec. 4.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import models
      >>> model = models.MLP(num_classes=3, hidden=(8,), dropout_rate=0.5)
      >>> x = jnp.ones((2, 4))
      >>> variables = model.init(jax.random.key(0), x)
      >>> out = models.mc_dropout_predict(
      ...     model, variables, x, key=jax.random.key(1), num_samples=5)
      >>> out.logits.shape, out.mutual_information.shape
      ((2, 3), (2,))
    """
    samples = mc_dropout_logits(
        model,
        variables,
        images,
        key=key,
        num_samples=num_samples,
        first_row=first_row,
    )
    return _average(samples)
