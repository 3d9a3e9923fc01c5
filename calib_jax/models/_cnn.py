"""A small convolutional network for the embedded 8x8 digits data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from calib_jax.models._common import FeatureClassifier, batch_norm, conv3x3


class CNNBackbone(nn.Module):
    """3x3 conv-BN-ReLU layers, one 2x2 average pool, then a dense ReLU layer.

    With ``dropout_rate > 0``, dropout follows the dense ReLU layer.
    """

    widths: Sequence[int] = (32, 64)
    hidden: int = 128
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = x.astype(self.dtype)
        for width in self.widths:
            x = conv3x3(width, dtype=self.dtype)(x)
            x = nn.relu(batch_norm(train, dtype=self.dtype)(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden, dtype=self.dtype)(x))
        if self.dropout_rate > 0:  # no layer at all at rate 0
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return x


class CNN(FeatureClassifier):
    """Small CNN: two 3x3 conv-BN-ReLU layers, 2x2 average pool, dense, classifier.

    On 8x8x1 digits: 8x8x32 -> 8x8x64 -> 4x4x64 -> 128 features -> K logits
    (about 0.15M parameters). Any input size works; the dense layer's input
    size follows the image size.

    Attributes:
      num_classes: K.
      widths: channels of the convolutions.
      hidden: feature dimension D.
      dropout_rate: dropout after the dense ReLU layer, on the D features
        (0 = none, and then no dropout layer exists). Needs a ``'dropout'``
        rng when ``train=True`` and the rate is positive;
        :func:`calib_jax.models.mc_dropout_logits` samples it at test time
        with the BatchNorm layers on their running averages.
      dtype: computation dtype (parameters and logits stay float32).
    """

    num_classes: int = 10
    widths: Sequence[int] = (32, 64)
    hidden: int = 128
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    def setup(self):
        self.backbone = CNNBackbone(
            widths=tuple(self.widths),
            hidden=self.hidden,
            dropout_rate=self.dropout_rate,
            dtype=self.dtype,
        )
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype)
