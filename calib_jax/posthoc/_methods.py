"""The post-hoc methods, one :class:`Entry` each (:data:`METHODS`): fit, calibration
maps with their parameter checks, and the class-wise loss scaling factory. Map keys
are what saved files name and never change."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from calib_jax.posthoc import (
    _base,
    _binary,
    _classwise_scaling,
    _cts,
    _dirichlet,
    _ets,
    _histogram,
    _isotonic,
    _matrix,
    _pts,
    _temperature,
    _temperature_fit,
)


class Map(NamedTuple):
    """``apply(params, logits [N, K])`` gives calibrated logits;
    ``check(params, *, values)`` raises ValueError for a tree (and with
    ``values``, values) ``apply`` does not take, else returns K (None: any)."""

    apply: Callable
    check: Callable


class Fitted(NamedTuple):
    """What a method's registry fit returns: the fields of a Calibrator."""

    params: Any
    aux: Any
    name: str
    apply_fn: Callable


class Entry(NamedTuple):
    """A method's registry fit, its ``maps`` by key, and for class-wise
    scaling its ``Method`` factory and that factory's ``options``."""

    fit: Callable[..., Fitted]
    maps: dict[str, Map]
    method: Callable[..., _base.Method] | None = None
    options: tuple[str, ...] = ()


def _fit_ts(logits, labels, *, where=None, objective: str = "nll", **kwargs):
    t = _temperature_fit.fit_temperature(
        logits, labels, where=where, objective=objective, **kwargs
    )
    return Fitted({"temperature": t}, None, f"ts:{objective}", MAPS["ts"].apply)


def _fit_ets(logits, labels, *, where=None, form: str = "original", **kwargs):
    params = _ets.fit_ets_params(logits, labels, where=where, form=form, **kwargs)
    key = "ets" if form == "original" else f"ets({form})"
    return Fitted(params, None, key, MAPS[key].apply)


def _fit_one(name: str, fitter: Callable) -> Callable[..., Fitted]:
    """The registry fit of a method with one map, keyed by its name."""

    def fit(logits, labels, *, where=None, **kwargs):
        params = fitter(logits, labels, where=where, **kwargs)
        return Fitted(params, None, name, MAPS[name].apply)

    return fit


def _fit_binned(name: str, fitter: Callable) -> Callable[..., Fitted]:
    """The registry fit of a method whose ``variant`` picks the map."""

    def fit(logits, labels, *, where=None, variant: str = "top_label", **kwargs):
        params = fitter(logits, labels, where=where, variant=variant, **kwargs)
        suffix = "" if variant == "top_label" else f"({variant})"
        return Fitted(params, None, name + suffix, MAPS[f"{name}({variant})"].apply)

    return fit


_CLASSWISE_OPTIONS = (
    "seed",
    "alpha0",
    "beta0",
    "alpha_bounds",
    "beta_bounds",
    "rounds",
    "weight_tol",
)


def _fit_classwise(base: str) -> Callable[..., Fitted]:
    """The registry fit of ``base`` trained with class-wise loss scaling."""

    def fit(logits, labels, *, where=None, objective: str = "nll", **kwargs):
        if objective != "nll":
            raise ValueError(
                "class-wise loss scaling trains on class-wise NLL losses: "
                f"'{base}+classwise' needs objective 'nll', got {objective!r}."
            )
        entry = METHODS[base]
        unknown = set(kwargs) - set(entry.options) - set(_CLASSWISE_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown option(s) for '{base}+classwise': {', '.join(sorted(unknown))}."
            )
        base_kw = {k: v for k, v in kwargs.items() if k in entry.options}
        if "hidden" in base_kw:
            base_kw["hidden"] = tuple(base_kw["hidden"])
        cw_kw = {k: v for k, v in kwargs.items() if k in _CLASSWISE_OPTIONS}
        # Cached factories: repeated fits reuse the compiled training functions.
        method = entry.method(**base_kw)
        params, aux = _classwise_scaling.fit_classwise(
            method, logits, labels, where=where, **cw_kw
        )
        name = "ts:nll+classwise" if base == "ts" else f"{base}+classwise"
        return Fitted(params, aux, name, method.apply)

    return fit


def _cached(factory: Callable) -> Callable:
    return functools.lru_cache(maxsize=16)(factory)


def _binned_maps(name: str, module) -> dict[str, Map]:
    return {
        f"{name}({variant})": Map(
            getattr(module, f"apply_{variant}"), module.check_params
        )
        for variant in ("top_label", "one_vs_rest")
    }


METHODS: dict[str, Entry] = {
    "ts": Entry(
        _fit_ts,
        {"ts": Map(_temperature.apply_ts_params, _temperature.check_ts_params)},
        _cached(_temperature.ts_method),
        ("max_iter", "tol"),
    ),
    "ets": Entry(
        _fit_ets,
        {
            "ets": Map(_ets.apply_fn("original"), _ets.check_ets_params),
            "ets(logit)": Map(_ets.apply_fn("logit"), _ets.check_ets_params),
        },
        _cached(_ets.ets_method),
        ("form", "max_iter", "tol"),
    ),
    "pts": Entry(
        _fit_one("pts", _pts.fit_pts),
        {"pts": Map(_pts.apply_pts_params, _pts.check_pts_params)},
        _cached(_pts.pts_method),
        ("top_k", "hidden", "steps", "learning_rate", "weight_decay"),
    ),
    "cts": Entry(
        _fit_one("cts", _cts.fit_cts),
        {"cts": Map(_cts.apply_cts_params, _cts.check_cts_params)},
        _cached(_cts.cts_method),
        ("max_iter", "tol"),
    ),
    "vector": Entry(
        _fit_one("vector", _matrix.fit_vector_scaling),
        {"vector": Map(_matrix.apply_vector_params, _base.check_vector_params)},
    ),
    "matrix": Entry(
        _fit_one("matrix", _matrix.fit_matrix_scaling),
        {"matrix": Map(_matrix.apply_matrix_params, _base.check_matrix_params)},
    ),
    "dirichlet": Entry(
        _fit_one("dirichlet", _dirichlet.fit_dirichlet),
        {
            "dirichlet": Map(
                _dirichlet.apply_dirichlet_params, _base.check_matrix_params
            )
        },
    ),
    "histogram_binning": Entry(
        _fit_binned("histogram_binning", _histogram.fit_histogram_binning),
        _binned_maps("histogram_binning", _histogram),
    ),
    "isotonic": Entry(
        _fit_binned("isotonic", _isotonic.fit_isotonic),
        _binned_maps("isotonic", _isotonic),
    ),
    "platt": Entry(
        _fit_one("platt", _binary.fit_platt),
        {"platt": Map(_binary.apply_platt_params, _binary.check_platt_params)},
    ),
    "beta": Entry(
        _fit_one("beta", _binary.fit_beta),
        {"beta": Map(_binary.apply_beta_params, _binary.check_beta_params)},
    ),
    **{
        f"{b}+classwise": Entry(_fit_classwise(b), {})
        for b in ("ts", "ets", "pts", "cts")
    },
}

#: Key -> calibration map of every method (what a saved file can name).
MAPS: dict[str, Map] = {k: m for e in METHODS.values() for k, m in e.maps.items()}


def num_classes(apply_fn: Callable, params) -> int | None:
    """The number of classes ``params`` of a library map are for, from shapes
    only; None for any K, a foreign map or a tree its map does not declare."""
    for m in MAPS.values():
        if m.apply is apply_fn:
            try:
                return m.check(params, values=False)
            except ValueError:
                return None
    return None
