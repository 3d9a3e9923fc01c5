"""Model FLOPs counted from the model's own convolution and matrix-product shapes.

An accelerator's utilisation (MFU, model FLOPs utilisation) divides the FLOPs a
model needs by the step time and the chip's peak. XLA's cost analysis cannot
supply the numerator on a GPU: convolutions that run as library calls (cuDNN)
are not counted there. :func:`count_flops` traces the model abstractly
(``jax.make_jaxpr`` on shapes; nothing is computed or compiled) and sums, over
every ``conv_general_dilated`` and ``dot_general`` of the traced program, the
multiply-adds its shapes imply:

* convolution: ``prod(output shape) * prod(kernel window) * kernel input
  features`` (with ``feature_group_count`` the kernel holds the input
  features of one group);
* matrix product: ``prod(output shape) * prod(contracted sizes)``.

One multiply-add is two FLOPs. BatchNorm, activations, pooling and residual
additions are not in :attr:`FlopCount.macs`; :attr:`FlopCount.elementwise`
estimates them at one FLOP per element produced by an arithmetic primitive
(per element read by a reduction), so their share can be stated (ResNet-20:
about 1% of the model FLOPs, 1.7% in training mode; WRN-28-10: under 0.2%).

:func:`train_step_flops` uses the usual convention that a training step costs
three forward passes (forward, then the gradients with respect to the
activations and to the weights, each as large as the forward); it includes
a gradient for the first layer's input, which no step computes (0.4% of a
ResNet-20 step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

# One FLOP per output element (or, for reductions, per input element).
_ELEMENTWISE = frozenset(
    "abs add div exp exp2 erf integer_pow log log1p logistic max min mul neg pow "
    "rsqrt sign sqrt square sub tanh".split()
)
_REDUCTIONS = frozenset("reduce_max reduce_min reduce_prod reduce_sum".split())


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """Forward cost of one example.

    Attributes:
      conv_macs: multiply-adds of the convolutions.
      dense_macs: multiply-adds of the matrix products (dense layers).
      elementwise: approximate FLOPs of everything else (one per element);
        work on parameters alone (BatchNorm's per-channel scale) is shared by
        the traced batch, so this figure varies slightly with the batch.
    """

    conv_macs: int
    dense_macs: int
    elementwise: int

    @property
    def macs(self) -> int:
        """Multiply-adds of the convolutions and matrix products."""
        return self.conv_macs + self.dense_macs

    @property
    def flops(self) -> int:
        """``2 * macs``: the model FLOPs of one forward pass (no elementwise)."""
        return 2 * self.macs


def _size(shape) -> int:
    return math.prod(int(d) for d in shape)


def _conv_macs(eqn) -> int:
    rhs = eqn.invars[1].aval
    (out,) = (v.aval for v in eqn.outvars)
    rhs_spec = eqn.params["dimension_numbers"].rhs_spec
    window = _size(rhs.shape[d] for d in rhs_spec[2:])
    return _size(out.shape) * window * rhs.shape[rhs_spec[1]]


def _dot_macs(eqn) -> int:
    lhs = eqn.invars[0].aval
    (out,) = (v.aval for v in eqn.outvars)
    (contract, _), _ = eqn.params["dimension_numbers"]
    return _size(out.shape) * _size(lhs.shape[d] for d in contract)


def _subjaxprs(value):
    if isinstance(value, jax_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _subjaxprs(v)


def _count(jaxpr) -> tuple[int, int, int]:
    """(conv MACs, dot MACs, elementwise FLOPs) of a jaxpr and its sub-jaxprs.

    A ``scan`` body counts ``length`` times, a ``cond`` its largest branch, a
    ``while`` body once (its trip count is not static).
    """
    conv = dot = elem = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "conv_general_dilated":
            conv += _conv_macs(eqn)
        elif name == "dot_general":
            dot += _dot_macs(eqn)
        elif name in _ELEMENTWISE:
            elem += _size(eqn.outvars[0].aval.shape)
        elif name in _REDUCTIONS:
            elem += _size(eqn.invars[0].aval.shape)
        subs = [_count(j) for v in eqn.params.values() for j in _subjaxprs(v)]
        if not subs:
            continue
        if name == "cond":
            subs = [max(subs, key=sum)]
        times = int(eqn.params["length"]) if name == "scan" else 1
        conv += times * sum(s[0] for s in subs)
        dot += times * sum(s[1] for s in subs)
        elem += times * sum(s[2] for s in subs)
    return conv, dot, elem


def count_flops(
    model,
    input_shape: Sequence[int],
    *,
    batch: int = 2,
    train: bool = False,
    dtype=jnp.float32,
) -> FlopCount:
    """Forward multiply-adds and FLOPs of one example, from the model's shapes.

    Traces ``model.init`` and ``model.apply`` on shapes only (``jax.eval_shape``
    and ``jax.make_jaxpr``), so it is fast for any model size; the counts are
    exact for the convolutions and matrix products (see the module docstring
    for what is counted and how).

    Args:
      model: an unbound flax linen module taking ``(x, train=...)``.
      input_shape: the shape of one example, e.g. ``(32, 32, 3)``.
      batch: examples per traced batch; the counts are divided by it (static).
      train: trace the training forward pass (batch statistics, dropout); the
        convolution and matrix-product counts are the same either way.
      dtype: input dtype.

    Returns:
      A :class:`FlopCount` per example.

    Raises:
      ValueError: ``batch`` below 1 or an empty ``input_shape`` (one line).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}.")
    if len(input_shape) == 0:
        raise ValueError("input_shape must name at least one axis, got ().")
    x = jax.ShapeDtypeStruct((batch, *(int(d) for d in input_shape)), dtype)
    key = jax.random.key(0)
    variables = jax.eval_shape(model.init, key, x)

    def forward(variables, x):
        if not train:
            return model.apply(variables, x, train=False)
        return model.apply(
            variables, x, train=True, rngs={"dropout": key}, mutable=["batch_stats"]
        )

    conv, dot, elem = _count(jax.make_jaxpr(forward)(variables, x).jaxpr)
    return FlopCount(conv // batch, dot // batch, elem // batch)


def train_step_flops(model, input_shape: Sequence[int], batch: int, **kwargs) -> int:
    """Model FLOPs of one training step on ``batch`` examples: ``3 * 2 * MACs * batch``.

    The convention of three forward passes per step (forward, gradient with
    respect to the activations, gradient with respect to the weights); the
    optimizer update and elementwise work are left out. ``kwargs`` go to
    :func:`count_flops`.
    """
    return 3 * count_flops(model, input_shape, **kwargs).flops * batch
