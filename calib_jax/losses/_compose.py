"""Composition of loss terms from a config list into one training objective."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from calib_jax.losses._base import masked_mean
from calib_jax.losses._validation_base import prepare

# [B, K] of the abstract batch a term is evaluated on when it is bound.
_PROBE_SHAPE = (4, 3)

LossFn = Callable[..., jax.Array]


def _hyperparameters(fn: LossFn) -> dict[str, inspect.Parameter]:
    """Keyword-only hyperparameters of a loss (everything but ``where``)."""
    sig = inspect.signature(fn)
    return {
        name: p
        for name, p in sig.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "where"
    }


def bind(name: str, fn: LossFn, hparams: Mapping[str, object]) -> LossFn:
    """Validates ``hparams`` against ``fn``'s signature and binds them."""
    accepted = _hyperparameters(fn)
    for key in hparams:
        if key not in accepted:
            valid = ", ".join(sorted(accepted)) or "none"
            raise ValueError(
                f"Loss '{name}' has no hyperparameter '{key}'; it accepts: {valid}."
            )
    bound = functools.partial(fn, **hparams) if hparams else fn
    _check_domains(name, bound, accepted)
    return bound


def _check_domains(name: str, bound: LossFn, accepted) -> None:
    """Traces ``bound`` with ``jax.eval_shape`` so that the loss's own checks
    raise on its concrete hyperparameters; the message gains the term's name."""
    b, k = _PROBE_SHAPE
    logits = jax.ShapeDtypeStruct((b, k), jnp.float32)
    labels = jax.ShapeDtypeStruct((b,), jnp.int32)
    mask = jax.ShapeDtypeStruct((b,), jnp.bool_)
    try:
        # Called as the objective calls its terms: with the batch mask.
        jax.eval_shape(lambda z, y, w: bound(z, y, where=w), logits, labels, mask)
    except (ValueError, TypeError) as err:
        message = str(err)
        head = message.split(" ", 1)[0]
        if head in accepted:
            message = f"{name}.{message}"
        else:
            message = f"loss term '{name}': {message}"
        kind = TypeError if isinstance(err, TypeError) else ValueError
        raise kind(message) from err


def compose(
    terms: Sequence[Mapping[str, object]],
    *,
    registry: Mapping[str, LossFn],
    batch_level: frozenset[str],
) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
    """Builds ``(logits, labels, where=None) -> (total, {'loss/<term>': value})``;
    a weight of 0 switches a term off (it is still computed and logged)."""
    if isinstance(terms, Mapping) or not terms:
        raise ValueError(
            "loss terms must be a non-empty list of dicts like "
            "[{'name': 'cross_entropy', 'weight': 1.0}, ...]."
        )
    built = []
    seen = {}
    for i, term in enumerate(terms):
        if not isinstance(term, Mapping) or "name" not in term:
            raise ValueError(
                f"loss term #{i} must be a dict with a 'name' key, got {term!r}."
            )
        term = dict(term)
        name = str(term.pop("name"))
        weight = term.pop("weight", 1.0)
        if name not in registry:
            raise ValueError(
                f"Unknown loss '{name}'. Valid names: {', '.join(sorted(registry))}."
            )
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ValueError(
                f"loss term '{name}': weight must be a number, got {weight!r}."
            )
        # Repeated names (e.g. two focal terms) get a numeric suffix in the logs.
        seen[name] = seen.get(name, 0) + 1
        key = f"loss/{name}" if seen[name] == 1 else f"loss/{name}_{seen[name]}"
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(
                f"loss term '{key[5:]}': weight must be a finite number >= 0 (0 "
                f"switches the term off), got {weight}."
            )
        fn = bind(name, registry[name], term)
        built.append((key, weight, fn, name in batch_level))

    def objective(logits, labels, where=None):
        logits, labels, mask = prepare(logits, labels, where)
        total = jnp.zeros((), jnp.float32)
        logs = {}
        for key, weight, fn, is_batch in built:
            value = fn(logits, labels, where=mask)
            if not is_batch:
                # Per-example terms: mean over the unmasked (global) batch.
                value = masked_mean(value, mask)
            value = value.astype(jnp.float32)
            logs[key] = value
            total = total + weight * value
        logs["loss/total"] = total
        return total, logs

    return objective
