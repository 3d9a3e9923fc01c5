"""A small multilayer perceptron for the embedded digits data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Flattens its input, applies ReLU layers, then a linear classifier head.

    ``features`` returns the penultimate representation and ``head`` the
    classifier, so two-stage methods can retrain the head alone.

    Attributes:
      num_classes: K, the number of logits.
      hidden: widths of the hidden layers.
      dropout_rate: dropout after each hidden ReLU (0 = none, and then no
        dropout layer exists: the outputs are those of the model without the
        option). Needs a ``'dropout'`` rng when ``train=True`` and the rate is
        positive; :func:`calib_jax.models.mc_dropout_logits` samples it at
        test time (Gal and Ghahramani 2016).
      dtype: computation dtype (parameters and logits stay float32).
    """

    num_classes: int = 10
    hidden: Sequence[int] = (128, 128)
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    def setup(self):
        self.layers = [nn.Dense(w, dtype=self.dtype) for w in self.hidden]
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype)
        if self.dropout_rate > 0:
            self.dropouts = [nn.Dropout(self.dropout_rate) for _ in self.hidden]

    def features(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Penultimate features: float ``[B, ...]`` inputs to float32 ``[B, D]``.

        ``train`` turns dropout on (no batch norm here).
        """
        x = x.reshape((x.shape[0], -1)).astype(self.dtype)
        for i, layer in enumerate(self.layers):
            x = nn.relu(layer(x))
            if self.dropout_rate > 0:
                x = self.dropouts[i](x, deterministic=not train)
        return x.astype(jnp.float32)

    def head(self, h: jax.Array) -> jax.Array:
        """The linear classifier: ``[B, D]`` features to float32 ``[B, K]`` logits."""
        return self.classifier(h).astype(jnp.float32)

    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Logits, float32 ``[B, K]``."""
        return self.head(self.features(x, train=train))
