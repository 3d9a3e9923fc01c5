"""Stage II of MaC-Cal: masked retraining of a new bottleneck head on frozen features.

Stage I is ordinary training (any config). Stage II (MaC-Cal, Sec. 4.2 and
Algorithm 1) freezes the stage-I feature extractor, replaces the linear head
with a randomly initialised two-layer bottleneck ``W_new``, samples a
Bernoulli(q) mask ``M`` on the head's weights, trains on
``z (M ⊙ W_new)`` (Eqs. 8-10), and adapts the retention probability ``q`` once
per epoch from the training accuracy and mean confidence (Eqs. 12-13).

Conventions (the paper leaves these open):

- The bottleneck is ``Dense(width) -> ReLU -> Dense(K)``; both kernels are
  masked, biases are not. At inference the head is unmasked and unscaled
  ("deterministic behaviour during inference").
- The masked gradient of Eq. 11 is exactly what the chain rule gives for the
  masked forward pass, so no separate gradient hook is needed; with plain SGD
  (the stage-II default: no momentum, no weight decay) masked weights do not
  move at all in that epoch.
- The text (Eq. 8) samples ``M`` once per epoch; Algorithm 1 (line 4) samples
  it per mini-batch. ``mask_every='epoch'`` (default) or ``'step'``.
- ``Acc_t`` and ``Conf_t`` are accumulated over the epoch's training batches
  as the masked model sees them (no extra pass over the training set).
- ``q`` is clamped to ``[0, 1]`` after each update (Algorithm 1, line 10).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from calib_jax import models, storage
from calib_jax.train import optim
from calib_jax.train.checkpoint import Checkpointer
from calib_jax.train.state import TrainState, create, variables


class BottleneckHead(nn.Module):
    """``Dense(width) -> ReLU -> Dense(num_classes)`` on frozen features."""

    width: int
    num_classes: int

    @nn.compact
    def __call__(self, z: jax.Array) -> jax.Array:
        h = nn.relu(nn.Dense(self.width, name="bottleneck")(z))
        return nn.Dense(self.num_classes, name="out")(h)


def retention_bound(
    epoch: jax.Array, total_epochs: int, eta_init: float, eta_final: float
):
    """Decaying clip bound of Eq. 13: ``eta_init * exp(log(eta_final/eta_init) t/T)``."""
    ratio = jnp.log(eta_final / eta_init)
    return eta_init * jnp.exp(ratio * epoch / total_epochs)


def update_retention(q, confidence, accuracy, *, gamma, bound):
    """Eq. 12: ``q + clip(Conf - gamma * Acc, -bound, bound)``, clamped to [0, 1]."""
    return jnp.clip(
        q + jnp.clip(confidence - gamma * accuracy, -bound, bound), 0.0, 1.0
    )


def sample_masks(head_params, q, key) -> dict:
    """Bernoulli(q) masks (float 0/1) for every kernel of the head (Eq. 8)."""
    leaves, treedef = jax.tree.flatten_with_path(head_params)
    keys = jax.random.split(key, len(leaves))
    out = []
    for (path, leaf), k in zip(leaves, keys):
        is_kernel = getattr(path[-1], "key", None) == "kernel"
        mask = (
            jax.random.bernoulli(k, q, leaf.shape)
            if is_kernel
            else jnp.ones(leaf.shape, bool)
        )
        out.append(mask.astype(leaf.dtype))
    return jax.tree.unflatten(treedef, out)


def masks_for(state: TrainState, params, period) -> dict:
    """The masks in force for ``period`` (an epoch, or a step with ``mask_every='step'``)."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 7919)
    return sample_masks(params, state.extra["q"], jax.random.fold_in(key, period))


def _load_stage_one(config: ConfigDict, dataset):
    what = "config.two_stage.stage1_workdir"
    directory = storage.as_path(config.two_stage.stage1_workdir or ".", what=what)
    storage.check_reachable(directory, what=what)
    cfg_path = directory / "config.json"
    if not config.two_stage.stage1_workdir or not cfg_path.exists():
        raise ValueError(
            f"two_stage.stage1_workdir '{directory}' holds no stage-I run (no config.json); "
            "train stage I first and point --config.two_stage.stage1_workdir at its workdir."
        )
    stage1 = ConfigDict(json.loads(cfg_path.read_text()))
    model = models.from_config(stage1.model, num_classes=dataset.num_classes)
    tx = optim.make_optimizer(stage1, 1)
    sample = jnp.zeros((1, *dataset.image_shape), jnp.float32)
    abstract = jax.eval_shape(lambda r: create(model, tx, r, sample), jax.random.key(0))
    restored = Checkpointer(directory).restore_latest(abstract)
    if restored is None:
        raise ValueError(f"No readable checkpoint under {directory / 'checkpoints'}.")
    return model, variables(restored)


@dataclasses.dataclass
class StageTwo:
    """What the trainer needs for stage II."""

    config: ConfigDict
    feature_model: nn.Module
    head: BottleneckHead
    frozen: dict
    image_shape: tuple

    def init_state(self, tx, rng) -> TrainState:
        sample = jnp.zeros((1, self._feature_dim()), jnp.float32)
        init_rng, state_rng = jax.random.split(rng)
        params = self.head.init(init_rng, sample)["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            batch_stats={},
            opt_state=tx.init(params),
            rng=jax.random.key_data(state_rng),
            extra=dict(
                frozen=self.frozen,
                q=jnp.asarray(self.config.two_stage.q0, jnp.float32),
                correct=jnp.zeros((), jnp.float32),
                confidence=jnp.zeros((), jnp.float32),
                count=jnp.zeros((), jnp.float32),
            ),
        )

    def _feature_dim(self) -> int:
        shape = jax.eval_shape(
            lambda v, x: self.feature_model.apply(v, x, method="features"),
            self.frozen,
            jax.ShapeDtypeStruct((1, *self.image_shape), jnp.float32),
        ).shape
        return int(shape[-1])

    def make_forward(self, steps_per_epoch: int) -> Callable:
        every = self.config.two_stage.mask_every

        def forward(state, params, images, rng, train):
            del rng
            z = self.feature_model.apply(
                state.extra["frozen"], images, train=False, method="features"
            )
            z = jax.lax.stop_gradient(z).astype(jnp.float32)
            if train:
                period = (
                    state.step // steps_per_epoch if every == "epoch" else state.step
                )
                key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 7919)
                masks = sample_masks(
                    params, state.extra["q"], jax.random.fold_in(key, period)
                )
                params = jax.tree.map(jnp.multiply, masks, params)
            return self.head.apply({"params": params}, z), state.batch_stats

        return forward

    def hooks(self, steps_per_epoch: int, num_steps: int) -> dict:
        ts = self.config.two_stage
        total_epochs = max(math.ceil(num_steps / steps_per_epoch), 1)

        def extra_hook(state, logits, labels, mask):
            e = state.extra
            logits = jax.lax.stop_gradient(logits)
            probs = jax.nn.softmax(logits, axis=-1)
            w = mask.astype(jnp.float32)
            correct = e["correct"] + jnp.sum(w * (jnp.argmax(logits, -1) == labels))
            confidence = e["confidence"] + jnp.sum(w * jnp.max(probs, -1))
            count = e["count"] + jnp.sum(w)
            epoch_end = (state.step + 1) % steps_per_epoch == 0
            epoch = (state.step + 1) // steps_per_epoch  # t in Eq. 13, 1-based
            bound = retention_bound(epoch, total_epochs, ts.eta_init, ts.eta_final)
            n = jnp.maximum(count, 1.0)
            new_q = update_retention(
                e["q"], confidence / n, correct / n, gamma=ts.gamma, bound=bound
            )
            zero = jnp.zeros((), jnp.float32)
            q = jnp.where(epoch_end, new_q, e["q"])
            extra = dict(
                frozen=e["frozen"],
                q=q,
                correct=jnp.where(epoch_end, zero, correct),
                confidence=jnp.where(epoch_end, zero, confidence),
                count=jnp.where(epoch_end, zero, count),
            )
            return extra, {"two_stage/q": q}  # the retention after this step

        return {"extra_hook": extra_hook}


def check_config(config: ConfigDict) -> None:
    """ValueError (one line, naming the field) for a bad ``config.two_stage`` number.

    The stage-I workdir is checked when it is read (:func:`build_stage_two`).
    """
    ts = config.two_stage
    if not 0.0 <= ts.q0 <= 1.0:
        raise ValueError(f"two_stage.q0 must lie in [0, 1], got {ts.q0}.")
    if not 0.0 < ts.eta_final <= ts.eta_init:
        raise ValueError("two_stage needs 0 < eta_final <= eta_init.")
    if ts.mask_every not in ("epoch", "step"):
        raise ValueError(
            f"two_stage.mask_every must be 'epoch' or 'step', got '{ts.mask_every}'."
        )


def build_stage_two(config: ConfigDict, dataset) -> StageTwo:
    """Loads the stage-I run and returns the stage-II pieces (validates first)."""
    check_config(config)
    ts = config.two_stage
    model, frozen = _load_stage_one(config, dataset)
    stage = StageTwo(
        config=config,
        feature_model=model,
        head=BottleneckHead(ts.bottleneck_width, dataset.num_classes),
        frozen=frozen,
        image_shape=tuple(dataset.image_shape),
    )
    return stage
