"""The :class:`Calibrator` pytree and the registry path (:data:`CALIBRATORS`,
:func:`get_calibrator`, :func:`fit`, :func:`load`) over ``_methods.METHODS``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from flax import struct

from calib_jax.posthoc import (
    _base,
    _binary,
    _core,
    _methods,
    _persist,
    _temperature,
    _validate,
)

ACCURACY_PRESERVING = ("ts", "ets", "pts")
#: Calibrators defined for K = 2 only (K != 2 is a one-line ValueError).
BINARY_ONLY = _binary.BINARY_ONLY


@struct.dataclass
class Calibrator:
    """A fitted post-hoc calibrator: parameters plus a pure apply function.

    ``apply`` returns *calibrated logits* (unnormalised logits or
    log-probabilities, ``docs/posthoc.md``); :meth:`probs` is their softmax.
    A pytree (``params`` and ``aux`` are leaves, ``name`` and ``apply_fn``
    static): it passes through ``jax.jit`` and ``jax.vmap``.

    Attributes:
      params: parameter pytree read by ``apply_fn``.
      aux: pytree of fit diagnostics not needed to apply the map (e.g. the
        class-wise scaling factors), or None.
      name: registry name, e.g. ``'ts:nll'`` or ``'cts+classwise'``.
      apply_fn: static ``(params, logits [N, K]) -> calibrated logits [N, K]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import posthoc
      >>> z = jnp.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [3.0, 0.0]])
      >>> cal = posthoc.fit("ts", z, jnp.array([0, 1, 1, 0]))
      >>> cal.apply(z).shape
      (4, 2)
    """

    params: Any
    aux: Any = None
    name: str = struct.field(pytree_node=False, default="")
    apply_fn: Callable[[Any, jax.Array], jax.Array] = struct.field(
        pytree_node=False, default=None
    )

    def apply(self, logits: jax.typing.ArrayLike) -> jax.Array:
        """Calibrated logits (or log-probabilities) ``[N, K]``.

        Raises:
          ValueError: logits of another K than the parameters are for (maps
            such as TS take any K).
        """
        logits = _core.upcast(logits)
        k = _methods.num_classes(self.apply_fn, self.params)
        if k is not None and (logits.ndim != 2 or logits.shape[1] != k):
            raise ValueError(
                f"calibrator {self.name!r} was fitted for K = {k} classes: logits "
                f"must have shape [N, {k}], got shape {logits.shape}."
            )
        return self.apply_fn(self.params, logits)

    def probs(self, logits: jax.typing.ArrayLike) -> jax.Array:
        """Calibrated probabilities ``[N, K]``."""
        return jax.nn.softmax(self.apply(logits), axis=-1)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Writes the calibrator to ``path`` for :func:`calib_jax.posthoc.load`.

        An ``.npz`` archive with a JSON header (format: ``docs/posthoc.md``),
        through ``etils.epath`` (``gs://`` works); loading is bit-identical.

        Args:
          path: destination file (local or object store).
          overwrite: replace an existing file (default: refuse).

        Raises:
          ValueError: ``path`` exists and ``overwrite`` is False, the
            ``apply_fn`` is none of the library's maps, or a leaf is not an
            array, a Python scalar or None (one line).

        Examples:
          >>> import os, tempfile
          >>> import jax.numpy as jnp
          >>> from calib_jax import posthoc
          >>> z = jnp.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [3.0, 0.0]])
          >>> cal = posthoc.fit("ts", z, jnp.array([0, 1, 1, 0]))
          >>> path = os.path.join(tempfile.mkdtemp(), "ts.npz")
          >>> cal.save(path)
          >>> bool((posthoc.load(path).apply(z) == cal.apply(z)).all())
          True
        """
        _persist.save(self, path, overwrite=overwrite)

    def summary(self) -> dict[str, Any]:
        """JSON summary of the parameters (larger arrays by shape, mean, min, max)."""
        return _base.summarize(self.params, self.aux)


def _calibrator_fit(fit: Callable[..., _methods.Fitted]) -> Callable[..., Calibrator]:
    @functools.wraps(fit)
    def fitter(logits, labels, *, where=None, **kwargs) -> Calibrator:
        return Calibrator(*fit(logits, labels, where=where, **kwargs))

    return fitter


#: Registry name -> fitter ``(logits, labels, *, where=None, **kw) -> Calibrator``.
CALIBRATORS: dict[str, Callable[..., Calibrator]] = {
    name: _calibrator_fit(entry.fit) for name, entry in _methods.METHODS.items()
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
      A :class:`Calibrator` (what ``apply`` returns, which methods preserve
      the argmax: ``docs/posthoc.md``).

    Raises:
      ValueError: one line: unknown name or option, an option outside its
        domain (``learning_rate <= 0``, negative ``tol``), NaN/inf logits,
        labels out of range, ``N = 0``, ``K < 2``, mismatched lengths, or
        ``K != 2`` for ``'platt'`` and ``'beta'``.

    Warns:
      SuspiciousFitWarning: one line when the validation accuracy is below
        chance (1/K), a fitted temperature lies outside [0.05, 20] or the
        rows are probabilities (``docs/posthoc.md``).

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
    # Values are checked by the fitter (inside its compiled call): here shapes.
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
        temperatures=_fitted_temperatures(cal.params),
        accuracy=accuracy,
        simplex=simplex,
    )
    return cal


def _fitted_temperatures(params):
    """The fitted temperature(s) of TS, ETS and CTS parameters, or None."""
    if isinstance(params, dict):
        for key in ("temperature", "temperatures"):
            if key in params:
                return params[key]
    return None


def load(path, *, name: str | None = None) -> Calibrator:
    """Reads a calibrator written by :meth:`Calibrator.save`.

    Args:
      path: local or object-store path (``etils.epath``).
      name: optional expected registry name (e.g. ``'ts:nll'``).

    Returns:
      The :class:`Calibrator`, its parameters and aux bit-identical.

    Raises:
      ValueError: one line naming the file: missing, unreadable or not a saved
        calibrator, another format or version, an unknown map, another
        ``name``, or arrays and parameters that do not match the header/map.
    """
    name, key, params, aux = _persist.read(path, name=name)
    return Calibrator(
        params=params, aux=aux, name=name, apply_fn=_methods.MAPS[key].apply
    )
