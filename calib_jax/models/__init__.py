"""Flax linen classifiers and the ``MODELS`` registry.

Every model maps images ``[B, H, W, C]`` to float32 logits ``[B, K]`` with
``__call__(x, train=False)``, and exposes ``features(x, train=False) -> [B, D]``
and ``head(h) -> [B, K]`` with ``__call__ == head(features(.))``. BatchNorm
statistics live in the ``batch_stats`` collection; ``dtype`` sets the
computation dtype (e.g. ``jnp.bfloat16``) while parameters stay float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models._cnn import CNN
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
    metrics) and ``kwargs`` (model attributes). A ``dtype`` inside ``kwargs``
    (the older spelling) is accepted when it does not contradict ``dtype``.

    Raises:
      ValueError: unknown model name, dtype or model option (one line).
    """
    kwargs = dict(model_config.get("kwargs") or {})
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
        ``dropout_rate=0.3`` (wide ResNets). A string ``dtype`` is converted
        with ``jnp.dtype``.

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
    "DTYPES",
    "MLP",
    "MODELS",
    "BottleneckResNet",
    "ResNet",
    "WideResNet",
    "check_dtype",
    "from_config",
    "get_model",
]
