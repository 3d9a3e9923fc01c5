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
    if isinstance(kwargs.get("dtype"), str):
        kwargs["dtype"] = jnp.dtype(kwargs["dtype"])
    return MODELS[name](num_classes=num_classes, **kwargs)


__all__ = [
    "CNN",
    "MLP",
    "MODELS",
    "BottleneckResNet",
    "ResNet",
    "WideResNet",
    "get_model",
]
