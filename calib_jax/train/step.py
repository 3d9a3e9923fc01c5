"""Pure train and eval steps; shardings are declared by the caller at the jit site."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec as P

from calib_jax.train import mesh as mesh_lib
from calib_jax.train.state import TrainState, variables

LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
# forward(state, params, images, rng, train) -> (logits, new_batch_stats)
ForwardFn = Callable[..., tuple[jax.Array, Any]]


def model_forward(model) -> ForwardFn:
    """The forward pass of a flax model with optional BatchNorm statistics."""

    def forward(state: TrainState, params, images, rng, train: bool):
        vs = dict(variables(state), params=params)
        if train and state.batch_stats:
            logits, updates = model.apply(
                vs, images, train=True, mutable=["batch_stats"], rngs={"dropout": rng}
            )
            return logits, updates["batch_stats"]
        logits = model.apply(vs, images, train=train, rngs={"dropout": rng})
        return logits, state.batch_stats

    return forward


def per_device(loss_fn: LossFn, mesh: Mesh) -> LossFn:
    """Computes ``loss_fn`` on each device's shard and averages over devices.

    This is the per-core semantics of the papers' TPU/multi-GPU code: a
    batch-level term (SB-ECE, S-AvUC, AU_Pxτ's CDF, MMCE, MDCA) sees only the
    local shard. The default (``global``) is ``loss_fn`` under plain jit, which
    sees the whole global batch.
    """
    spec = P(mesh_lib.AXIS)

    def local(logits, labels, mask):
        total, logs = loss_fn(logits, labels, mask)
        mean = lambda v: jax.lax.pmean(v, mesh_lib.AXIS)  # noqa: E731
        return mean(total), jax.tree.map(mean, logs)

    def wrapped(logits, labels, mask):
        return jax.shard_map(
            local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=(P(), P())
        )(logits, labels, mask)

    return wrapped


def make_train_step(
    forward: ForwardFn,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    *,
    augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    grad_hook: Callable[[Any, TrainState, jax.Array], Any] | None = None,
    extra_hook: Callable[
        [TrainState, jax.Array, jax.Array, jax.Array], tuple[Any, dict[str, jax.Array]]
    ]
    | None = None,
):
    """Builds ``train_step(state, batch) -> (state, metrics)``.

    Args:
      forward: see :func:`model_forward`.
      loss_fn: ``(logits, labels, mask) -> (total, {'loss/<term>': v})``.
      tx: the optimizer.
      augment: optional on-device augmentation ``(images, rng) -> images``.
      grad_hook: optional ``(grads, state, rng) -> grads`` (MaC-Cal gradient mask).
      extra_hook: optional ``(state, logits, labels, mask) -> (new extra,
        metrics)`` run after the update (MaC-Cal's epoch statistics and ``q``
        update); its metrics join the step's.

    Returns:
      The pure step. ``metrics`` holds the loss terms, the sums
      ``train/correct``, ``train/confidence``, ``train/count`` of the global
      batch and the metrics of ``extra_hook``.
    """

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        aug_rng, drop_rng, hook_rng = jax.random.split(rng, 3)
        images = batch["image"]
        if augment is not None:
            images = augment(images, aug_rng)
        mask = batch["mask"]

        def objective(params):
            logits, new_stats = forward(state, params, images, drop_rng, True)
            total, logs = loss_fn(logits, batch["label"], mask)
            return total, (logs, new_stats, logits)

        grad_fn = jax.value_and_grad(objective, has_aux=True)
        (_, (logs, new_stats, logits)), grads = grad_fn(state.params)
        if grad_hook is not None:
            grads = grad_hook(grads, state, hook_rng)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            batch_stats=new_stats,
            opt_state=opt_state,
        )
        hook_metrics = {}
        if extra_hook is not None:
            extra, hook_metrics = extra_hook(state, logits, batch["label"], mask)
            new_state = new_state.replace(extra=extra)
        metrics = dict(logs, **batch_sums(logits, batch["label"], mask, prefix="train"))
        metrics.update(hook_metrics)
        return new_state, metrics

    return train_step


def batch_sums(logits, labels, mask, prefix: str) -> dict[str, jax.Array]:
    """Mergeable sums (correct, confidence, count) over the unmasked batch."""
    logits = jax.lax.stop_gradient(logits).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    correct = (jnp.argmax(logits, axis=-1) == labels) & mask
    confidence = jnp.where(mask, jnp.max(probs, axis=-1), 0.0)
    return {
        f"{prefix}/correct": jnp.sum(correct.astype(jnp.float32)),
        f"{prefix}/confidence": jnp.sum(confidence),
        f"{prefix}/count": jnp.sum(mask.astype(jnp.float32)),
    }


def make_eval_step(forward: ForwardFn):
    """Builds ``eval_step(state, images) -> float32 logits`` (inference mode)."""

    def eval_step(state: TrainState, images: jax.Array) -> jax.Array:
        key = jax.random.wrap_key_data(state.rng)
        logits, _ = forward(state, state.params, images, key, False)
        return logits.astype(jnp.float32)

    return eval_step
