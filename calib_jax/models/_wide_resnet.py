"""Wide residual networks for CIFAR: WRN-28-10 and WRN-26-10.

References:
  [1] S. Zagoruyko, N. Komodakis, "Wide Residual Networks", BMVC 2016,
      arXiv:1605.07146v4, Sec. 2 and Table 1.
  [2] J. Mukhoti, V. Kulharia, A. Sanyal, S. Golodetz, P. H. S. Torr,
      P. K. Dokania, "Calibrating Deep Neural Networks using Focal Loss",
      NeurIPS 2020, arXiv:2002.09437v2, Sec. 5 (the WRN-26-10 baseline).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models._common import FeatureClassifier
from calib_jax.models._resnet import CifarBackbone


class WideResNet(FeatureClassifier):
    """WRN-d-k: three stages of basic blocks with ``16k``, ``32k``, ``64k`` channels.

    Two depth conventions exist, selected by ``preact``:

    * ``preact=True`` (default, [1]): pre-activation blocks with dropout between
      the convolutions, 1x1 projection shortcuts on the pre-activated input,
      ``depth = 6n + 4``. WRN-28-10 (n = 4) has about 36.5M parameters.
    * ``preact=False``: the post-activation variant used for WRN-26-10 by [2]'s
      experiments, ``depth = 6n + 2`` (so WRN-26-10 also has n = 4 blocks per
      stage; 26 is not of the form ``6n + 4``), 1x1 projection + BatchNorm
      shortcuts, about 36.5M parameters.

    Attributes:
      num_classes: K.
      depth: network depth (see above).
      width: widening factor k.
      dropout_rate: dropout between the two convolutions of each block
        (0 = none; [1] uses 0.3 on CIFAR). Needs a ``'dropout'`` rng when
        ``train=True`` and the rate is positive.
      preact: which of the two conventions above.
      dtype: computation dtype (parameters and logits stay float32).
    """

    num_classes: int = 10
    depth: int = 28
    width: int = 10
    dropout_rate: float = 0.0
    preact: bool = True
    dtype: Any = jnp.float32

    def setup(self):
        offset = 4 if self.preact else 2
        if (self.depth - offset) % 6 or self.depth < offset + 6:
            raise ValueError(
                f"WideResNet depth must be 6n + {offset} with preact={self.preact}, "
                f"got {self.depth}."
            )
        n = (self.depth - offset) // 6
        k = self.width
        self.backbone = CifarBackbone(
            stage_sizes=(n, n, n),
            widths=(16 * k, 32 * k, 64 * k),
            preact=self.preact,
            shortcut="B",
            dropout_rate=self.dropout_rate,
            dtype=self.dtype,
        )
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype)
