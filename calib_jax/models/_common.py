"""Building blocks shared by the convolutional models.

Conventions (chosen to match the PyTorch reference implementations that the
calibration papers train):

* 3x3 convolutions use explicit padding 1, so a stride-2 convolution samples
  the same positions as ``nn.Conv2d(..., padding=1)`` (flax's ``'SAME'`` pads
  asymmetrically for even inputs).
* Convolutions have no bias and use He-normal (fan-out) initialisation.
* BatchNorm uses momentum 0.9 and epsilon 1e-5 (PyTorch's 0.1 / 1e-5) and keeps
  its running statistics in the ``batch_stats`` collection. Under data-sharded
  ``jax.jit`` the batch statistics are those of the *global* batch, not of one
  device's shard as in per-GPU PyTorch training.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def conv3x3(features: int, strides: int = 1, *, dtype: Any, name=None) -> nn.Conv:
    """A bias-free 3x3 convolution with PyTorch-style padding 1."""
    return nn.Conv(
        features,
        (3, 3),
        strides=(strides, strides),
        padding=((1, 1), (1, 1)),
        use_bias=False,
        kernel_init=conv_init,
        dtype=dtype,
        name=name,
    )


def conv1x1(features: int, strides: int = 1, *, dtype: Any, name=None) -> nn.Conv:
    """A bias-free 1x1 convolution (projection shortcut, bottleneck ends)."""
    return nn.Conv(
        features,
        (1, 1),
        strides=(strides, strides),
        padding="VALID",
        use_bias=False,
        kernel_init=conv_init,
        dtype=dtype,
        name=name,
    )


def batch_norm(train: bool, *, dtype: Any, name=None) -> nn.BatchNorm:
    """BatchNorm over the batch and spatial axes; statistics in ``batch_stats``."""
    return nn.BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        epsilon=1e-5,
        dtype=dtype,
        name=name,
    )


def shortcut_a(x: jax.Array, features: int, strides: int) -> jax.Array:
    """Option-A shortcut of He et al. (2016): subsample, then zero-pad channels.

    Parameter-free; used by the CIFAR ResNets when the width or resolution of a
    stage changes.
    """
    if strides > 1:
        x = x[:, ::strides, ::strides, :]
    extra = features - x.shape[-1]
    if extra:
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra)))
    return x


def global_avg_pool(x: jax.Array) -> jax.Array:
    """Spatial mean in float32: ``[B, H, W, D] -> [B, D]``."""
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2))


class FeatureClassifier(nn.Module):
    """Base class: a ``backbone`` submodule followed by a linear ``classifier``.

    Subclasses define ``setup`` creating ``self.backbone`` (called as
    ``backbone(x, train=train) -> [B, D]``) and ``self.classifier``. The split
    lets two-stage methods take penultimate features with
    ``model.apply(variables, x, train=False, method=model.features)``, and
    ``model(x) == model.head(model.features(x))`` holds by construction.
    """

    def features(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Penultimate features.

        Args:
          x: float ``[B, H, W, C]`` normalised images.
          train: batch statistics (and dropout) when True, running averages
            otherwise.

        Returns:
          float32 ``[B, D]``.
        """
        return self.backbone(x, train=train).astype(jnp.float32)

    def head(self, h: jax.Array) -> jax.Array:
        """The linear classifier: ``[B, D]`` features to float32 ``[B, K]`` logits."""
        return self.classifier(h).astype(jnp.float32)

    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Logits, float32 ``[B, K]``, for images ``x`` ``[B, H, W, C]``."""
        return self.head(self.features(x, train=train))
