"""The :class:`Calibrator` pytree and the registry path: :data:`CALIBRATORS`,
:func:`get_calibrator`, :func:`fit` and :func:`load`, all from the one method
table of ``_methods.py``.

Names: ``'ts'``, ``'ets'``, ``'pts'``, ``'cts'``, ``'vector'``, ``'matrix'``,
``'dirichlet'``, ``'histogram_binning'``, ``'isotonic'``, the binary-only
``'platt'`` and ``'beta'`` (K = 2), and ``'<base>+classwise'`` for ``base``
in TS, ETS, PTS, CTS. ``get_calibrator``/``fit`` also accept
``'ts:<objective>'`` (``nll``, ``sb_ece``, ``hb_ece``, ``ece_grid``) and
``'ts:nll+classwise'``.
"""

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

    ``apply`` returns *calibrated logits*: unnormalised logits for TS, PTS,
    CTS, vector/matrix scaling and Dirichlet calibration, and log-probabilities
    for the probability-space ETS mixture. Either way
    ``jax.nn.softmax(calibrator.apply(logits))`` gives the calibrated
    probabilities (:meth:`probs`).

    A ``Calibrator`` is a pytree (``params`` and ``aux`` are its leaves;
    ``name`` and ``apply_fn`` are static), so it passes through ``jax.jit``
    and comes out of ``jax.vmap`` with batched parameters.

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
          ValueError: logits with another number of classes than the
            parameters are for (vector/matrix scaling, Dirichlet, CTS,
            binning...; maps such as TS take any K).
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
        """Writes the calibrator to ``path`` (read back by
        :func:`calib_jax.posthoc.load`).

        The file is a NumPy ``.npz`` archive with a JSON header (format
        version 1, registry name, calibration map, pytree structure) and the
        parameter and aux arrays; see :mod:`calib_jax.posthoc._persist`.
        Written through ``etils.epath``, so ``gs://`` paths work. Loading
        gives bit-identical parameters and outputs.

        Args:
          path: destination file (local or object store).
          overwrite: replace an existing file (default: refuse).

        Raises:
          ValueError: ``path`` exists and ``overwrite`` is False, or the
            calibrator was not built by :func:`calib_jax.posthoc.fit` (its
            ``apply_fn`` is not one of the library's maps) or holds a leaf
            that is not an array, a Python scalar or None (one line).

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
        """Host-side summary of the fitted parameters (JSON-serialisable).

        Scalars are reported as floats; arrays by shape, mean, min and max;
        small vectors (at most 8 entries) in full.
        """
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
      name: optional expected registry name (e.g. ``'ts:nll'``); another
        name is an error.

    Returns:
      The :class:`~calib_jax.posthoc.Calibrator`, with parameters and aux
      bit-identical to the saved ones.

    Raises:
      ValueError: missing or unreadable file, a file that is not a saved
        calibrator, another format kind or version, an unknown calibration
        map, a name that does not fit the map or is not ``name``, a corrupt
        archive member, a stored dtype other than the header's, or
        parameters that the map does not read or its fitter never returns
        (one line naming the file).
    """
    name, key, params, aux = _persist.read(path, name=name)
    return Calibrator(
        params=params, aux=aux, name=name, apply_fn=_methods.MAPS[key].apply
    )
