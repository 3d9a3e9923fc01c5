"""CIFAR ResNets: basic-block ResNet-20/32/56/110, PreResNet and ResNet-50.

References:
  [1] K. He, X. Zhang, S. Ren, J. Sun, "Deep Residual Learning for Image
      Recognition", CVPR 2016, arXiv:1512.03385v1, Sec. 4.2 (CIFAR-10 nets).
  [2] K. He, X. Zhang, S. Ren, J. Sun, "Identity Mappings in Deep Residual
      Networks", ECCV 2016, arXiv:1603.05027v3 (pre-activation units).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from calib_jax.models._common import (
    FeatureClassifier,
    batch_norm,
    conv1x1,
    conv3x3,
    global_avg_pool,
    shortcut_a,
)

SHORTCUTS = ("A", "B")


class BasicBlock(nn.Module):
    """Post-activation basic block: ``relu(bn(conv(relu(bn(conv(x))))) + s(x))``.

    Attributes:
      features: output channels.
      strides: stride of the first convolution (2 at a stage's first block).
      shortcut: ``'A'`` (parameter-free subsample + zero-pad, [1] Sec. 4.2) or
        ``'B'`` (1x1 projection + BatchNorm) when the shape changes.
      dropout_rate: dropout between the two convolutions (0 = none).
      dtype: computation dtype.
    """

    features: int
    strides: int = 1
    shortcut: str = "A"
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        f, s, dt = self.features, self.strides, self.dtype
        y = nn.relu(batch_norm(train, dtype=dt)(conv3x3(f, s, dtype=dt)(x)))
        if self.dropout_rate > 0:
            y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = batch_norm(train, dtype=dt)(conv3x3(f, dtype=dt)(y))
        if s == 1 and x.shape[-1] == f:
            residual = x
        elif self.shortcut == "A":
            residual = shortcut_a(x, f, s)
        else:
            residual = batch_norm(train, dtype=dt)(conv1x1(f, s, dtype=dt)(x))
        return nn.relu(y + residual)


class PreActBlock(nn.Module):
    """Pre-activation basic block ([2]): ``conv(relu(bn(conv(relu(bn(x)))))) + s(x)``.

    With shortcut ``'B'`` the 1x1 projection reads the pre-activated input, as in
    [2] and in the wide ResNets.

    Attributes:
      features: output channels.
      strides: stride of the first convolution.
      shortcut: ``'A'`` or ``'B'`` (see :class:`BasicBlock`).
      dropout_rate: dropout between the two convolutions (wide ResNets).
      dtype: computation dtype.
    """

    features: int
    strides: int = 1
    shortcut: str = "A"
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        f, s, dt = self.features, self.strides, self.dtype
        pre = nn.relu(batch_norm(train, dtype=dt)(x))
        if s == 1 and x.shape[-1] == f:
            residual = x
        elif self.shortcut == "A":
            residual = shortcut_a(x, f, s)
        else:
            residual = conv1x1(f, s, dtype=dt)(pre)
        y = conv3x3(f, s, dtype=dt)(pre)
        y = nn.relu(batch_norm(train, dtype=dt)(y))
        if self.dropout_rate > 0:
            y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = conv3x3(f, dtype=dt)(y)
        return y + residual


class CifarBackbone(nn.Module):
    """3x3 stem, then stages of basic blocks, then global average pooling.

    Attributes:
      stage_sizes: blocks per stage.
      widths: channels per stage; every stage after the first halves the
        resolution in its first block.
      stem_width: channels of the stem convolution.
      preact: pre-activation blocks (and a final BN-ReLU before pooling).
      shortcut: ``'A'`` or ``'B'``.
      dropout_rate: dropout inside every block.
      dtype: computation dtype.
    """

    stage_sizes: Sequence[int]
    widths: Sequence[int]
    stem_width: int = 16
    preact: bool = False
    shortcut: str = "A"
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        dt = self.dtype
        x = conv3x3(self.stem_width, dtype=dt)(x.astype(dt))
        if not self.preact:
            x = nn.relu(batch_norm(train, dtype=dt)(x))
        block = PreActBlock if self.preact else BasicBlock
        for i, (n, width) in enumerate(zip(self.stage_sizes, self.widths)):
            for j in range(n):
                x = block(
                    width,
                    strides=2 if i > 0 and j == 0 else 1,
                    shortcut=self.shortcut,
                    dropout_rate=self.dropout_rate,
                    dtype=dt,
                )(x, train=train)
        if self.preact:
            x = nn.relu(batch_norm(train, dtype=dt)(x))
        return global_avg_pool(x)


class ResNet(FeatureClassifier):
    """CIFAR ResNet of depth ``6n + 2`` ([1] Sec. 4.2), optionally pre-activation ([2]).

    Three stages of ``n`` basic blocks with 16, 32 and 64 channels on 32x32,
    16x16 and 8x8 maps, global average pooling and a linear classifier.
    ResNet-20/32/56/110 have n = 3/5/9/18 and about 0.27M/0.46M/0.85M/1.7M
    parameters with the default option-A (parameter-free) shortcut, which is the
    one [1] uses on CIFAR-10.

    Attributes:
      num_classes: K, the number of logits.
      depth: ``6n + 2``.
      preact: pre-activation units ([2]); PreResNet-56 is ``depth=56, preact=True``.
      shortcut: ``'A'`` (default, [1]'s CIFAR choice) or ``'B'`` (projection).
      dtype: computation dtype (parameters and logits stay float32).

    Examples:
      Shapes only (``jax.eval_shape``: nothing is computed or compiled):

      >>> import jax, jax.numpy as jnp
      >>> model = ResNet(num_classes=10, depth=20)
      >>> x = jnp.zeros((2, 32, 32, 3))
      >>> variables = jax.eval_shape(model.init, jax.random.key(0), x)
      >>> sum(p.size for p in jax.tree.leaves(variables["params"]))  # ResNet-20
      269722
      >>> jax.eval_shape(model.apply, variables, x).shape
      (2, 10)
    """

    num_classes: int = 10
    depth: int = 20
    preact: bool = False
    shortcut: str = "A"
    dtype: Any = jnp.float32

    def setup(self):
        if (self.depth - 2) % 6 or self.depth < 8:
            raise ValueError(f"ResNet depth must be 6n + 2 (n >= 1), got {self.depth}.")
        if self.shortcut not in SHORTCUTS:
            raise ValueError(
                f"shortcut must be one of {', '.join(SHORTCUTS)}, "
                f"got '{self.shortcut}'."
            )
        n = (self.depth - 2) // 6
        self.backbone = CifarBackbone(
            stage_sizes=(n, n, n),
            widths=(16, 32, 64),
            preact=self.preact,
            shortcut=self.shortcut,
            dtype=self.dtype,
        )
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype)


class Bottleneck(nn.Module):
    """Bottleneck block: 1x1 reduce, strided 3x3, 1x1 expand by 4, projection shortcut.

    The stride sits on the 3x3 convolution (torchvision's "v1.5" placement; the
    parameter count is the same as [1]'s).

    Attributes:
      features: bottleneck width; the block outputs ``4 * features`` channels.
      strides: stride of the 3x3 convolution.
      dtype: computation dtype.
    """

    features: int
    strides: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        f, s, dt = self.features, self.strides, self.dtype
        y = nn.relu(batch_norm(train, dtype=dt)(conv1x1(f, dtype=dt)(x)))
        y = nn.relu(batch_norm(train, dtype=dt)(conv3x3(f, s, dtype=dt)(y)))
        y = batch_norm(train, dtype=dt)(conv1x1(4 * f, dtype=dt)(y))
        if s == 1 and x.shape[-1] == 4 * f:
            residual = x
        else:
            residual = batch_norm(train, dtype=dt)(conv1x1(4 * f, s, dtype=dt)(x))
        return nn.relu(y + residual)


class BottleneckBackbone(nn.Module):
    """CIFAR stem (3x3 conv, stride 1, no max-pool) and four bottleneck stages."""

    stage_sizes: Sequence[int] = (3, 4, 6, 3)
    widths: Sequence[int] = (64, 128, 256, 512)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        dt = self.dtype
        x = conv3x3(self.widths[0], dtype=dt)(x.astype(dt))
        x = nn.relu(batch_norm(train, dtype=dt)(x))
        for i, (n, width) in enumerate(zip(self.stage_sizes, self.widths)):
            for j in range(n):
                strides = 2 if i > 0 and j == 0 else 1
                x = Bottleneck(width, strides=strides, dtype=dt)(x, train=train)
        return global_avg_pool(x)


class BottleneckResNet(FeatureClassifier):
    """ResNet-50 ([1] Table 1 stages) with the CIFAR stem: about 23.5M parameters.

    The ImageNet 7x7/2 stem and max-pool are replaced by one 3x3 stride-1
    convolution, so 32x32 inputs reach the last stage at 4x4. Shortcuts are 1x1
    projections when the shape changes (option B of [1]).

    Attributes:
      num_classes: K.
      stage_sizes: bottleneck blocks per stage; ``(3, 4, 6, 3)`` is ResNet-50.
      dtype: computation dtype (parameters and logits stay float32).
    """

    num_classes: int = 10
    stage_sizes: Sequence[int] = (3, 4, 6, 3)
    dtype: Any = jnp.float32

    def setup(self):
        self.backbone = BottleneckBackbone(
            stage_sizes=tuple(self.stage_sizes), dtype=self.dtype
        )
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype)
