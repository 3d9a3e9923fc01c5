"""The training state: one pytree, so the step is a pure function of pytrees."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
    """Everything a train step reads and writes.

    Attributes:
      step: int32 scalar, the number of updates applied so far. Data order, the
        learning-rate schedule and every random draw derive from it, which is
        what makes a resumed run identical to an uninterrupted one.
      params: model parameters.
      batch_stats: BatchNorm running statistics (an empty dict for models
        without BatchNorm).
      opt_state: optax state.
      rng: base PRNG key; step ``s`` uses ``fold_in(rng, s)``.
      extra: method-specific state (e.g. the MaC-Cal mask retention ``q``);
        an empty dict otherwise.
    """

    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: optax.OptState
    rng: jax.Array
    extra: Any


def variables(state: TrainState) -> dict[str, Any]:
    """The flax variable dict of ``state`` for ``model.apply``."""
    out = {"params": state.params}
    if state.batch_stats:
        out["batch_stats"] = state.batch_stats
    return out


def create(
    model, tx, rng: jax.Array, sample_input: jax.Array, extra=None
) -> TrainState:
    """Initialises the model and the optimizer (use under ``jax.jit``)."""
    init_rng, state_rng = jax.random.split(rng)
    variables_ = model.init({"params": init_rng, "dropout": init_rng}, sample_input)
    params = variables_["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=variables_.get("batch_stats", {}),
        opt_state=tx.init(params),
        rng=jax.random.key_data(state_rng),
        extra={} if extra is None else extra,
    )
