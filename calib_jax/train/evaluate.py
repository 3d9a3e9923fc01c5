"""Evaluation over whole splits: padded-and-masked batches, logits gathered once."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from calib_jax import metrics

SPLIT_METRICS = ("accuracy", "nll", "ece", "adaptive_ece", "classwise_ece", "brier")


def collect_logits(
    eval_step: Callable,
    state,
    batches: Iterable[dict[str, np.ndarray]],
    put: Callable[[dict], dict] | None,
    transform: Callable[[jax.Array, int], jax.Array] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Runs ``eval_step`` over every batch and returns the unpadded logits and labels.

    Args:
      eval_step: jitted ``(state, images) -> logits`` over the data mesh.
      state: the train state.
      batches: padded batches with ``image``, ``label``, ``mask``: this
        process's slices (assembled by ``put``) or global arrays.
      put: assembles a process-local batch into global arrays; None when
        ``batches`` are global arrays already.
      transform: optional ``(images, batch_index) -> images`` on device (a
        corruption for shifted evaluation).

    Returns:
      ``(logits float32 [N, K], labels int32 [N])`` of the whole split, on
      every process (gathered once per batch, padding removed).
    """
    all_logits, all_labels = [], []
    for i, local in enumerate(batches):
        batch = put(local) if put is not None else local
        images = batch["image"] if transform is None else transform(batch["image"], i)
        logits = eval_step(state, images)
        gathered = multihost_utils.process_allgather(
            {"logits": logits, "label": batch["label"], "mask": batch["mask"]},
            tiled=True,
        )
        keep = np.asarray(gathered["mask"], bool)
        all_logits.append(np.asarray(gathered["logits"])[keep])
        all_labels.append(np.asarray(gathered["label"])[keep])
    return np.concatenate(all_logits), np.concatenate(all_labels).astype(np.int32)


def split_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, NLL, ECE (15 equal-width bins, l1), adaptive and classwise ECE, Brier."""
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    labels = jnp.asarray(labels)
    out = {}
    for name in SPLIT_METRICS:
        out[name] = float(metrics.get_metric(name)(probs, labels))
    return out
