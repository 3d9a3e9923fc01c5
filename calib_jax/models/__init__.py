"""Flax linen classifiers and the ``MODELS`` registry.

Every model maps images ``[B, H, W, C]`` to float32 logits ``[B, K]`` with
``__call__(x, train=False)``, and exposes ``features(x, train=False) -> [B, D]``
and ``head(h) -> [B, K]`` with ``__call__ == head(features(.))``. BatchNorm
statistics live in the ``batch_stats`` collection; ``dtype`` sets the
computation dtype (e.g. ``jnp.bfloat16``) while parameters stay float32.

Models with a ``dropout_rate`` option (:data:`DROPOUT_MODELS`) can be sampled
at test time with :func:`mc_dropout_logits` / :func:`mc_dropout_predict`
(MC dropout, Gal and Ghahramani 2016). :func:`count_flops` counts a model's
forward multiply-adds from its convolution and dense shapes (for MFU figures).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models._cnn import CNN
from calib_jax.models._flops import FlopCount, count_flops, train_step_flops
from calib_jax.models._mc_dropout import (
    MCDropoutPrediction,
    count_dropout_layers,
    mc_dropout_average,
    mc_dropout_logits,
    mc_dropout_predict,
)
from calib_jax.models._mlp import MLP
from calib_jax.models._resnet import BottleneckResNet, ResNet
from calib_jax.models._wide_resnet import WideResNet

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn": CNN,
    "resnet20": functools.partial(ResNet, depth=20),
    "resnet32": functools.partial(ResNet, depth=32),
    "resnet56": functools.partial(ResNet, depth=56),
    "resnet110": functools.partial(ResNet, depth=110),
    "preresnet56": functools.partial(ResNet, depth=56, preact=True),
    "resnet50": functools.partial(BottleneckResNet, stage_sizes=(3, 4, 6, 3)),
    "wrn28_10": functools.partial(WideResNet, depth=28, width=10, preact=True),
    "wrn26_10": functools.partial(WideResNet, depth=26, width=10, preact=False),
}


def _takes_dropout(ctor) -> bool:
    cls = ctor.func if isinstance(ctor, functools.partial) else ctor
    return "dropout_rate" in getattr(cls, "__dataclass_fields__", {})


# Models with a ``dropout_rate`` option (``config.model.dropout_rate``).
DROPOUT_MODELS = tuple(name for name, ctor in MODELS.items() if _takes_dropout(ctor))


# Computation dtypes a config may name (``config.model.dtype``). Parameters,
# optimizer state, losses and metrics stay float32 whatever the choice.
DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype, what: str = "dtype") -> jnp.dtype:
    """The ``jnp.dtype`` of a computation dtype name; ValueError (one line) otherwise."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or dtype
    if str(name) not in DTYPES:
        raise ValueError(
            f"Unknown {what} '{dtype}'. Valid dtypes: {', '.join(DTYPES)}."
        )
    return jnp.dtype(str(name))


def from_config(model_config, *, num_classes: int) -> nn.Module:
    """Builds the model a config's ``model`` field describes.

    ``model_config`` is ``config.model``: ``name``, ``dtype`` (the computation
    dtype, default ``'float32'``; ``'bfloat16'`` gives bf16 activations and
    matrix products with float32 parameters, optimizer state, losses and
    metrics), ``dropout_rate`` (default 0: no dropout layer; the models of
    :data:`DROPOUT_MODELS` take a positive rate) and ``kwargs`` (model
    attributes). A ``dtype`` inside ``kwargs`` (the older spelling) is
    accepted when it does not contradict ``dtype``.

    Raises:
      ValueError: unknown model name, dtype or model option, a dropout rate
        outside ``[0, 1)`` or one for a model without dropout (one line).
    """
    kwargs = dict(model_config.get("kwargs") or {})
    rate = model_config.get("dropout_rate", 0.0)
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not 0.0 <= rate < 1.0
    ):
        raise ValueError(
            f"config.model.dropout_rate must be a number in [0, 1), got {rate!r}."
        )
    if rate > 0:
        name = model_config["name"]
        if name in MODELS and name not in DROPOUT_MODELS:
            raise ValueError(
                f"config.model.dropout_rate={rate}: model '{name}' has no dropout; "
                f"models with dropout: {', '.join(DROPOUT_MODELS)}."
            )
        if "dropout_rate" in kwargs and kwargs["dropout_rate"] != rate:
            raise ValueError(
                f"config.model.dropout_rate={rate} contradicts "
                f"config.model.kwargs.dropout_rate={kwargs['dropout_rate']}; set "
                "only config.model.dropout_rate."
            )
        kwargs["dropout_rate"] = float(rate)
    dtype = model_config.get("dtype", "float32")
    check_dtype(dtype, "config.model.dtype")
    if "dtype" in kwargs:
        legacy = check_dtype(kwargs.pop("dtype"), "config.model.kwargs.dtype")
        if dtype != "float32" and legacy != jnp.dtype(dtype):
            raise ValueError(
                f"config.model.dtype='{dtype}' contradicts config.model.kwargs.dtype="
                f"'{legacy}'; set only config.model.dtype."
            )
        dtype = legacy.name
    try:
        return get_model(
            model_config["name"], num_classes=num_classes, dtype=dtype, **kwargs
        )
    except TypeError as e:  # a misspelt or unknown model option
        raise ValueError(f"config.model.kwargs: {e}.") from None


def get_model(name: str, *, num_classes: int, **kwargs) -> nn.Module:
    """Builds the registered model ``name``.

    Args:
      name: a key of :data:`MODELS`.
      num_classes: K, the number of logits.
      **kwargs: model attributes, e.g. ``dtype='bfloat16'`` or
        ``dropout_rate=0.3`` (the models of :data:`DROPOUT_MODELS`). A string
        ``dtype`` is converted with ``jnp.dtype``.

    Returns:
      The unbound flax module.

    Raises:
      ValueError: unknown ``name``.
    """
    if name not in MODELS:
        raise ValueError(f"Unknown model '{name}'. Valid models: {', '.join(MODELS)}.")
    if "dtype" in kwargs:
        kwargs["dtype"] = check_dtype(kwargs["dtype"])
    return MODELS[name](num_classes=num_classes, **kwargs)


__all__ = [
    "CNN",
    "DROPOUT_MODELS",
    "DTYPES",
    "FlopCount",
    "MLP",
    "MODELS",
    "BottleneckResNet",
    "MCDropoutPrediction",
    "ResNet",
    "WideResNet",
    "check_dtype",
    "count_dropout_layers",
    "count_flops",
    "from_config",
    "get_model",
    "mc_dropout_average",
    "mc_dropout_logits",
    "mc_dropout_predict",
    "train_step_flops",
]
