"""Optimizers and learning-rate schedules from config (optax)."""

from __future__ import annotations

import jax
import optax
from ml_collections import ConfigDict

OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "cosine", "piecewise")


def make_schedule(config: ConfigDict, num_steps: int) -> optax.Schedule:
    """Learning-rate schedule of ``config.schedule`` over ``num_steps`` updates.

    ``piecewise`` multiplies the rate by ``decay_factor`` at each fraction of
    training in ``boundaries`` (the papers' CIFAR schedules: x0.1 at epochs
    150 and 250 of 350 is ``boundaries=(150/350, 250/350)``). Every schedule
    takes an optional linear warm-up of ``warmup_steps``.
    """
    s = config.schedule
    lr = config.optimizer.learning_rate
    if s.name == "constant":
        main = optax.constant_schedule(lr)
    elif s.name == "cosine":
        main = optax.cosine_decay_schedule(lr, max(num_steps - s.warmup_steps, 1))
    elif s.name == "piecewise":
        bounds = {
            int(round(b * num_steps)) - s.warmup_steps: s.decay_factor
            for b in s.boundaries
        }
        main = optax.piecewise_constant_schedule(lr, bounds)
    else:
        raise ValueError(
            f"Unknown schedule '{s.name}'. Valid schedules: {', '.join(SCHEDULES)}."
        )
    if s.warmup_steps <= 0:
        return main
    warmup = optax.linear_schedule(0.0, lr, s.warmup_steps)
    return optax.join_schedules([warmup, main], [s.warmup_steps])


def _decay_mask(params, which: str):
    if which == "all":
        return jax.tree.map(lambda _: True, params)
    # 'kernels': weights of dense/conv layers only, not biases or norm scales.
    return jax.tree.map(lambda x: x.ndim > 1, params)


def make_optimizer(config: ConfigDict, num_steps: int) -> optax.GradientTransformation:
    """The optimizer of ``config.optimizer`` with ``config.schedule``.

    Weight decay is the papers' L2 (PyTorch ``SGD(weight_decay=...)``): the
    gradient gets ``weight_decay * param`` added *before* momentum and the
    learning rate (coupled), applied to all parameters by default
    (``decay='all'``, as the PyTorch code of the papers does) or to kernels only
    (``decay='kernels'``). ``adamw`` uses decoupled decay (Loshchilov & Hutter).
    """
    o = config.optimizer
    schedule = make_schedule(config, num_steps)
    if o.name == "sgd":
        l2 = optax.add_decayed_weights(
            o.weight_decay, mask=lambda p: _decay_mask(p, o.decay)
        )
        sgd = optax.sgd(schedule, momentum=o.momentum or None, nesterov=o.nesterov)
        return optax.chain(l2, sgd)
    if o.name == "adamw":
        return optax.adamw(
            schedule,
            weight_decay=o.weight_decay,
            mask=lambda p: _decay_mask(p, o.decay),
        )
    raise ValueError(
        f"Unknown optimizer '{o.name}'. Valid optimizers: {', '.join(OPTIMIZERS)}."
    )
