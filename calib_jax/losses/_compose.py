"""Composition of loss terms from a config list into one training objective."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from calib_jax.losses import _common, _released
from calib_jax.losses._focal import _DUAL_VARIANTS

# Variants per loss where they differ from ('paper', 'released_code').
_VARIANTS = {"dual_focal": _DUAL_VARIANTS}


def _check_variant(name: str, value) -> None:
    """``<loss>.variant`` must be one of that loss's variants (checked when the
    objective is built, before any compute)."""
    _released.check_variant(
        value, _VARIANTS.get(name.split(".")[0], _released.VARIANTS)
    )


# Validation of hyperparameter values by name, shared by every loss that takes
# them. Each rule gets (name, value) and raises ValueError on a concrete bad value.
_RULES: dict[str, Callable[[str, object], None]] = {
    "temperature": _common.check_positive,
    "nu": _common.check_positive,
    "bandwidth": _common.check_positive,
    "kappa": _common.check_nonnegative,
    "gamma": _common.check_nonnegative,
    "margin": _common.check_nonnegative,
    "alpha": _common.check_nonnegative,
    "lambda_1": _common.check_nonnegative,
    "lambda_2": _common.check_nonnegative,
    "num_bins": lambda _, v: _common.check_num_bins(v),
    "coverage": lambda n, v: v is None or _common.check_unit_interval(n, v),
    "epsilon": lambda n, v: _common.check_unit_interval(n, v, closed_left=True),
    "p": lambda n, v: _common.check_positive(n, v),
    "weight_grad": _common.check_bool,
    "variant": _check_variant,
}

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
    """Validates ``hparams`` against ``fn``'s signature and binds them.

    Raises:
      ValueError: an unknown hyperparameter (the accepted ones are listed) or a
        concrete value outside its domain (e.g. ``temperature <= 0``).
    """
    accepted = _hyperparameters(fn)
    for key, value in hparams.items():
        if key not in accepted:
            valid = ", ".join(sorted(accepted)) or "none"
            raise ValueError(
                f"Loss '{name}' has no hyperparameter '{key}'; it accepts: {valid}."
            )
        rule = _RULES.get(key)
        if rule is not None:
            rule(f"{name}.{key}", value)
    return functools.partial(fn, **hparams) if hparams else fn


def compose(
    terms: Sequence[Mapping[str, object]],
    *,
    registry: Mapping[str, LossFn],
    batch_level: frozenset[str],
) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
    """Builds ``(logits, labels, where=None) -> (total, {'loss/<term>': value})``.

    Used through :func:`calib_jax.losses.composite`, which supplies the registry.
    """
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
        fn = bind(name, registry[name], term)
        # Repeated names (e.g. two focal terms) get a numeric suffix in the logs.
        seen[name] = seen.get(name, 0) + 1
        key = f"loss/{name}" if seen[name] == 1 else f"loss/{name}_{seen[name]}"
        built.append((key, weight, fn, name in batch_level))

    def objective(logits, labels, where=None):
        logits, labels, mask = _common.prepare(logits, labels, where)
        total = jnp.zeros((), jnp.float32)
        logs = {}
        for key, weight, fn, is_batch in built:
            value = fn(logits, labels, where=mask)
            if not is_batch:
                # Per-example terms: mean over the unmasked (global) batch.
                value = _common.masked_mean(value, mask)
            value = value.astype(jnp.float32)
            logs[key] = value
            total = total + weight * value
        logs["loss/total"] = total
        return total, logs

    return objective
