"""``CALIBRATORS`` registry, ``get_calibrator`` and ``fit``.

Names: ``'ts'``, ``'ets'``, ``'pts'``, ``'cts'``, ``'vector'``, ``'matrix'``,
``'dirichlet'``, ``'histogram_binning'``, ``'isotonic'``, the binary-only
``'platt'`` and ``'beta'`` (K = 2), and ``'<base>+classwise'`` for ``base``
in TS, ETS, PTS, CTS. ``get_calibrator``/``fit`` also accept ``'ts:<objective>'`` (``nll``,
``sb_ece``, ``hb_ece``, ``ece_grid``) and ``'ts:nll+classwise'``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from calib_jax.posthoc import (
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
    _validate,
)
from calib_jax.posthoc._calibrator import Calibrator

ACCURACY_PRESERVING = ("ts", "ets", "pts")
#: Calibrators defined for K = 2 only (K != 2 is a one-line ValueError).
BINARY_ONLY = _binary.BINARY_ONLY


def fit_ts(logits, labels, *, where=None, objective: str = "nll", **kwargs):
    """Temperature scaling; see :func:`calib_jax.posthoc.fit_temperature`."""
    t = _temperature.fit_temperature(
        logits, labels, where=where, objective=objective, **kwargs
    )
    return Calibrator(
        params={"temperature": t},
        name=f"ts:{objective}",
        apply_fn=_temperature.apply_ts_params,
    )


def fit_ets(logits, labels, *, where=None, form: str = "original", **kwargs):
    """Ensemble temperature scaling; see :func:`calib_jax.posthoc.fit_ets_params`."""
    params = _ets.fit_ets_params(logits, labels, where=where, form=form, **kwargs)
    name = "ets" if form == "original" else f"ets({form})"
    return Calibrator(params=params, name=name, apply_fn=_ets.apply_fn(form))


def fit_pts(logits, labels, *, where=None, **kwargs):
    """Parameterized TS; see :func:`calib_jax.posthoc.fit_pts`."""
    params = _pts.fit_pts(logits, labels, where=where, **kwargs)
    return Calibrator(params=params, name="pts", apply_fn=_pts.apply_pts_params)


def fit_cts(logits, labels, *, where=None, **kwargs):
    """Class-based TS; see :func:`calib_jax.posthoc.fit_cts`."""
    params = _cts.fit_cts(logits, labels, where=where, **kwargs)
    return Calibrator(params=params, name="cts", apply_fn=_cts.apply_cts_params)


def fit_vector(logits, labels, *, where=None, **kwargs):
    """Vector scaling; see :func:`calib_jax.posthoc.fit_vector_scaling`."""
    params = _matrix.fit_vector_scaling(logits, labels, where=where, **kwargs)
    return Calibrator(
        params=params, name="vector", apply_fn=_matrix.apply_vector_params
    )


def fit_matrix(logits, labels, *, where=None, **kwargs):
    """Matrix scaling; see :func:`calib_jax.posthoc.fit_matrix_scaling`."""
    params = _matrix.fit_matrix_scaling(logits, labels, where=where, **kwargs)
    return Calibrator(
        params=params, name="matrix", apply_fn=_matrix.apply_matrix_params
    )


def fit_dirichlet(logits, labels, *, where=None, **kwargs):
    """Dirichlet calibration (ODIR); see :func:`calib_jax.posthoc.fit_dirichlet`."""
    params = _dirichlet.fit_dirichlet(logits, labels, where=where, **kwargs)
    return Calibrator(
        params=params, name="dirichlet", apply_fn=_dirichlet.apply_dirichlet_params
    )


def fit_histogram_binning(
    logits, labels, *, where=None, variant: str = "top_label", **kwargs
):
    """Histogram binning; see :func:`calib_jax.posthoc.fit_histogram_binning`."""
    params = _histogram.fit_histogram_binning(
        logits, labels, where=where, variant=variant, **kwargs
    )
    apply_fn = (
        _histogram.apply_top_label
        if variant == "top_label"
        else _histogram.apply_one_vs_rest
    )
    name = "histogram_binning" + ("" if variant == "top_label" else f"({variant})")
    return Calibrator(params=params, name=name, apply_fn=apply_fn)


def fit_isotonic(logits, labels, *, where=None, variant: str = "top_label"):
    """Isotonic regression (host fit); see
    :func:`calib_jax.posthoc.fit_isotonic`."""
    params = _isotonic.fit_isotonic(logits, labels, where=where, variant=variant)
    apply_fn = (
        _isotonic.apply_top_label
        if variant == "top_label"
        else _isotonic.apply_one_vs_rest
    )
    name = "isotonic" + ("" if variant == "top_label" else f"({variant})")
    return Calibrator(params=params, name=name, apply_fn=apply_fn)


def fit_platt(logits, labels, *, where=None, **kwargs):
    """Platt scaling (K = 2); see :func:`calib_jax.posthoc.fit_platt`."""
    params = _binary.fit_platt(logits, labels, where=where, **kwargs)
    return Calibrator(params=params, name="platt", apply_fn=_binary.apply_platt_params)


def fit_beta(logits, labels, *, where=None, **kwargs):
    """Beta calibration (K = 2); see :func:`calib_jax.posthoc.fit_beta`."""
    params = _binary.fit_beta(logits, labels, where=where, **kwargs)
    return Calibrator(params=params, name="beta", apply_fn=_binary.apply_beta_params)


# Method factories are cached so that repeated fits with the same options
# reuse the compiled training functions.
_ts_method = functools.lru_cache(maxsize=16)(_temperature.ts_method)
_ets_method = functools.lru_cache(maxsize=16)(_ets.ets_method)
_pts_method = functools.lru_cache(maxsize=16)(_pts.pts_method)
_cts_method = functools.lru_cache(maxsize=16)(_cts.cts_method)

_CLASSWISE_OPTIONS = (
    "seed",
    "alpha0",
    "beta0",
    "alpha_bounds",
    "beta_bounds",
    "rounds",
    "weight_tol",
)
_BASE_OPTIONS = {
    "ts": ("max_iter", "tol"),
    "ets": ("form", "max_iter", "tol"),
    "pts": ("top_k", "hidden", "steps", "learning_rate", "weight_decay"),
    "cts": ("max_iter", "tol"),
}
_FACTORIES = {
    "ts": _ts_method,
    "ets": _ets_method,
    "pts": _pts_method,
    "cts": _cts_method,
}


def _classwise_fitter(base: str) -> Callable[..., Calibrator]:
    def fitter(logits, labels, *, where=None, objective: str = "nll", **kwargs):
        if objective != "nll":
            raise ValueError(
                "class-wise loss scaling trains on class-wise NLL losses: "
                f"'{base}+classwise' needs objective 'nll', got {objective!r}."
            )
        unknown = set(kwargs) - set(_BASE_OPTIONS[base]) - set(_CLASSWISE_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown option(s) for '{base}+classwise': {', '.join(sorted(unknown))}."
            )
        base_kw = {k: v for k, v in kwargs.items() if k in _BASE_OPTIONS[base]}
        if "hidden" in base_kw:
            base_kw["hidden"] = tuple(base_kw["hidden"])
        cw_kw = {k: v for k, v in kwargs.items() if k in _CLASSWISE_OPTIONS}
        method = _FACTORIES[base](**base_kw)
        params, aux = _classwise_scaling.fit_classwise(
            method, logits, labels, where=where, **cw_kw
        )
        apply_fn = method.apply
        name = "ts:nll+classwise" if base == "ts" else f"{base}+classwise"
        return Calibrator(params=params, aux=aux, name=name, apply_fn=apply_fn)

    fitter.__name__ = f"fit_{base}_classwise"
    fitter.__doc__ = (
        f"{base.upper()} trained with class-wise loss scaling; see "
        ":func:`calib_jax.posthoc.fit_classwise` (host function, not jittable)."
    )
    return fitter


CALIBRATORS: dict[str, Callable[..., Calibrator]] = {
    "ts": fit_ts,
    "ets": fit_ets,
    "pts": fit_pts,
    "cts": fit_cts,
    "vector": fit_vector,
    "matrix": fit_matrix,
    "dirichlet": fit_dirichlet,
    "histogram_binning": fit_histogram_binning,
    "isotonic": fit_isotonic,
    "platt": fit_platt,
    "beta": fit_beta,
    "ts+classwise": _classwise_fitter("ts"),
    "ets+classwise": _classwise_fitter("ets"),
    "pts+classwise": _classwise_fitter("pts"),
    "cts+classwise": _classwise_fitter("cts"),
}


def _known_names() -> str:
    ts = [f"ts:{o}" for o in _temperature.OBJECTIVES]
    return ", ".join(sorted(CALIBRATORS) + ts + ["ts:nll+classwise"])


def get_calibrator(name: str) -> Callable[..., Calibrator]:
    """Returns the fitter ``(logits, labels, *, where=None, **kw) -> Calibrator``.

    ``name`` is a key of :data:`CALIBRATORS` or ``'ts:<objective>'``
    (optionally ``'ts:nll+classwise'``).

    Raises:
      ValueError: unknown name; the message lists the known names.
    """
    if not isinstance(name, str):
        raise TypeError(f"calibrator name must be a string, got {name!r}.")
    base, suffix = name, ""
    if name.endswith("+classwise"):
        base, suffix = name[: -len("+classwise")], "+classwise"
    objective = None
    if base.startswith("ts:"):
        base, objective = "ts", base[3:]
        if objective not in _temperature.OBJECTIVES:
            raise ValueError(
                f"unknown TS objective {objective!r} in {name!r}; known "
                f"calibrators: {_known_names()}."
            )
    key = base + suffix
    if key not in CALIBRATORS:
        raise ValueError(
            f"unknown calibrator {name!r}; known calibrators: {_known_names()}."
        )
    fitter = CALIBRATORS[key]
    if objective is None:
        return fitter
    return functools.partial(fitter, objective=objective)


# Options whose sign the fitters take on trust: (must be > 0, else >= 0).
_OPTION_SIGNS = {
    "learning_rate": True,
    "tol": False,
    "weight_decay": False,
    "weight_tol": False,
}


def _check_options(name: str, kwargs: dict) -> None:
    """ValueError for a real-valued option outside its domain (one line)."""
    for key, strict in _OPTION_SIGNS.items():
        if key not in kwargs or isinstance(kwargs[key], jax.core.Tracer):
            continue
        try:
            value = float(kwargs[key])
        except (TypeError, ValueError):
            raise ValueError(
                f"{name}: option {key} must be a number, got {kwargs[key]!r}."
            ) from None
        if not (value > 0 if strict else value >= 0):  # NaN fails both
            bound = "> 0" if strict else ">= 0"
            raise ValueError(f"{name}: option {key} must be {bound}, got {value}.")


def fit(
    name: str,
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    **kwargs,
) -> Calibrator:
    """Fits the calibrator registered as ``name`` on validation logits.

    Args:
      name: e.g. ``'ts'``, ``'ts:sb_ece'``, ``'ets'``, ``'cts+classwise'``,
        ``'dirichlet'`` (see :data:`CALIBRATORS`).
      logits: float ``[N, K]`` validation logits.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      **kwargs: options of the method's fitter (e.g. ``objective``,
        ``max_iter``, ``form``, ``steps``, ``off_diagonal``, ``rounds``).

    Returns:
      A :class:`Calibrator`; ``calibrator.apply(test_logits)`` gives the
      calibrated logits (log-probabilities for ETS, histogram binning,
      isotonic regression, Platt and Beta); ``calibrator.save(path)``
      writes it for :func:`calib_jax.posthoc.load`. TS, ETS and PTS (with
      or without class-wise scaling) preserve the argmax; the others do
      not in general.

    Raises:
      ValueError: unknown name or option, an option outside its domain
        (``learning_rate <= 0``, negative ``tol``), NaN/inf logits, labels
        out of range, ``N = 0``, ``K < 2``, ``K != 2`` for a binary-only
        calibrator (``'platt'``, ``'beta'``) or mismatched lengths
        (one-line messages).

    Warns:
      SuspiciousFitWarning: one line when the validation accuracy is below
        chance (1/K) or a fitted temperature (TS, ETS, CTS and their
        class-wise variants) lies outside [0.05, 20], naming the likely
        cause (labels misaligned with the logits, probabilities passed as
        logits).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import posthoc
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> cal = posthoc.fit("ts:nll", z, y)
      >>> print(cal.name, f"{float(cal.params['temperature']):.2f}")
      ts:nll 3.46
    """
    fitter = get_calibrator(name)
    if name in BINARY_ONLY:
        _binary.check_binary(name, logits)
    # Values are checked by the fitter (inside its own compiled call where it
    # can): here only shapes and dtypes, before the options.
    _validate.check_inputs(logits, labels, where, values=False)
    _check_options(name, kwargs)
    try:
        with _validate.quiet_fit_warnings() as diagnostics:
            cal = fitter(logits, labels, where=where, **kwargs)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise ValueError(
                f"unknown option for calibrator {name!r}: {err}."
            ) from None
        raise
    accuracy, simplex = diagnostics.get((logits, labels, where))
    _validate.warn_if_suspicious(
        logits,
        labels,
        where,
        name=f"calibrator {name!r}",
        temperatures=fitted_temperatures(cal.params),
        accuracy=accuracy,
        simplex=simplex,
    )
    return cal


def fitted_temperatures(params):
    """The fitted temperature(s) of TS, ETS and CTS parameters, or None."""
    if isinstance(params, dict):
        for key in ("temperature", "temperatures"):
            if key in params:
                return params[key]
    return None
