"""The post-hoc fitters' input checks (static ones always, value checks on
concrete arrays only; :mod:`calib_jax._checks`) and fit warnings."""

from __future__ import annotations

import contextlib
import contextvars
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks

is_concrete = _checks.is_concrete


def check_inputs(
    logits, labels, where=None, *, name: str = "logits", values: bool = True
):
    """Checks ``(logits [N, K], labels [N], where [N] | None)``; returns them
    as JAX arrays. ``name``: how messages call the logits. ``values=False``
    skips the value checks, for a fitter that runs :func:`value_summary` in
    its own compiled call and then :func:`raise_for_values`."""
    logits, labels, where = _checks.check_scores_labels(
        logits, labels, where, name=name, purpose="fitting"
    )
    if values:
        _checks.check_values(logits, labels, where, name=name, family="fit")
    return logits, labels, where


def value_summary(logits, labels, where):
    """:func:`calib_jax._checks.value_summary` of a fitter's inputs (traceable)."""
    return _checks.value_summary(logits, labels, where)


def raise_for_values(summary, shape, *, name: str = "logits") -> None:
    """Raises the one-line ValueError a :func:`value_summary` calls for."""
    _checks.raise_for_values(summary, shape[1], name=name, family="fit")


def screen_summary(logits, labels, where):
    """:func:`value_summary` with rows screened by their sum (traceable): a
    finite row of huge logits may also overflow, and :func:`raise_for_screen`
    re-checks flagged rows exactly."""
    x = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return _checks.value_summary(
        logits, labels, where, row_finite=jnp.isfinite(jnp.sum(x, axis=1))
    )


def raise_for_screen(summary, logits, labels, where, *, name: str = "logits"):
    """Raises for a :func:`screen_summary`; rows it flags as NaN/inf are
    checked exactly first (a row of huge finite logits is fine)."""
    if not is_concrete(*summary):
        return
    if int(summary.nonfinite) and int(summary.included):
        _checks.check_values(logits, labels, where, name=name, family="fit")
        summary = summary._replace(nonfinite=0)
    _checks.raise_for_values(summary, logits.shape[1], name=name, family="fit")


def check_temperature(t, *, name: str = "temperature"):
    """ValueError unless a concrete temperature is finite and > 0 everywhere."""
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating) and not jnp.issubdtype(
        t.dtype, jnp.integer
    ):
        raise TypeError(f"{name} must be a real number, got dtype {t.dtype}.")
    if is_concrete(t):
        v = np.asarray(t, dtype=np.float64)
        if not (np.isfinite(v).all() and (v > 0).all()):
            bad = v[~(np.isfinite(v) & (v > 0))].ravel()[0]
            raise ValueError(f"{name} must be finite and > 0, got {bad}.")
    return t


def check_nonnegative(name: str, value):
    """A concrete ``value >= 0`` as float (tracers pass through unchanged)."""
    _checks.check_nonnegative(name, value)
    v = _checks.concrete_float(value)
    return value if v is None else v


#: Fitted temperatures outside this range trigger :class:`SuspiciousFitWarning`.
TEMPERATURE_RANGE = (0.05, 20.0)


class SuspiciousFitWarning(UserWarning):
    """A fit whose inputs look wrong: validation accuracy below chance, a
    fitted temperature outside :data:`TEMPERATURE_RANGE`, or inputs whose
    rows are probability vectors rather than logits."""


class _Diagnostics:
    """Accuracy and simplex flag reported by fitters inside
    :func:`quiet_fit_warnings`, keyed by the identity of their input objects."""

    def __init__(self):
        self._entries = []

    def put(self, inputs, accuracy, simplex):
        self._entries.append((inputs, accuracy, simplex))

    def get(self, inputs):
        """``(accuracy, simplex)`` reported for these very objects, or Nones."""
        for seen, accuracy, simplex in self._entries:
            if len(seen) == len(inputs) and all(a is b for a, b in zip(seen, inputs)):
                return accuracy, simplex
        return None, None


_QUIET = contextvars.ContextVar("calib_jax_posthoc_quiet", default=None)


@contextlib.contextmanager
def quiet_fit_warnings():
    """Silences :func:`warn_if_suspicious` inside (``posthoc.fit`` warns once);
    yields the diagnostics the inner fitters reported."""
    diagnostics = _Diagnostics()
    token = _QUIET.set(diagnostics)
    try:
        yield diagnostics
    finally:
        _QUIET.reset(token)


def report_diagnostics(inputs, accuracy, simplex) -> None:
    """Records a fitter's accuracy (None: not computed) and simplex flag for
    its ``(logits, labels, where)`` objects inside :func:`quiet_fit_warnings`."""
    diagnostics = _QUIET.get()
    if diagnostics is not None:
        diagnostics.put(inputs, accuracy, simplex)


# Rows checked for "probabilities passed as logits" (the first ones): real
# logits whose first 1024 rows all lie on the simplex do not occur.
_SIMPLEX_ROWS = 1024


@jax.jit
def simplex_rows(logits, where):
    """Whether the first included rows all look like probability vectors."""
    logits, where = logits[:_SIMPLEX_ROWS], where[:_SIMPLEX_ROWS]
    simplex = (jnp.min(logits, axis=-1) >= 0) & (
        jnp.abs(jnp.sum(logits, axis=-1) - 1.0) <= 1e-3
    )
    return jnp.all(simplex | ~where) & jnp.any(where)


@jax.jit
def _accuracy(logits, labels, where):
    correct = (jnp.argmax(logits, axis=-1) == labels) & where
    return jnp.sum(correct) / jnp.maximum(jnp.sum(where), 1)


def suspicious_fit_message(
    logits, labels, where=None, temperatures=None, accuracy=None, simplex=None
):
    """The reasons a fit on concrete inputs looks wrong, in one line, or None;
    ``accuracy`` and ``simplex`` (:func:`simplex_rows`) are computed if None."""
    k = np.shape(logits)[-1]
    if accuracy is None or simplex is None:
        logits = jnp.asarray(logits)
        labels = jnp.asarray(labels)
        mask = (
            jnp.ones(labels.shape, bool) if where is None else jnp.asarray(where, bool)
        )
        if accuracy is None:
            accuracy = _accuracy(logits, labels, mask)
        if simplex is None:
            simplex = simplex_rows(logits, mask)
    parts = []
    acc = float(accuracy)
    if bool(simplex):
        parts.append(
            "the rows are non-negative and sum to 1: these look like "
            "probabilities, not logits (pass logits, or log-probabilities)"
        )
    if acc < 1.0 / k:
        parts.append(
            f"validation accuracy {acc:.4f} is below chance (1/K = {1.0 / k:.4f}): "
            "the labels are probably misaligned with the logits (rows in another "
            "order, or labels of another split)"
        )
    if temperatures is not None:
        t = np.asarray(temperatures, np.float64).ravel()
        lo, hi = TEMPERATURE_RANGE
        if t.size and np.nanmax(t) > hi:
            parts.append(
                f"fitted temperature {np.nanmax(t):.4g} is above {hi:g}: the logits "
                "barely predict the labels (labels misaligned with the logits?)"
            )
        if t.size and np.nanmin(t) < lo:
            parts.append(
                f"fitted temperature {np.nanmin(t):.4g} is below {lo:g}: the inputs "
                "spread far less than logits (probabilities or rescaled logits "
                "passed as logits?)"
            )
    return "; ".join(parts) if parts else None


def warn_if_suspicious(
    logits,
    labels,
    where=None,
    *,
    name,
    temperatures=None,
    accuracy=None,
    simplex=None,
):
    """One-line :class:`SuspiciousFitWarning`, prefixed by ``name``, when a
    fit on concrete inputs looks wrong (:func:`suspicious_fit_message`); none
    inside :func:`quiet_fit_warnings`."""
    if _QUIET.get() is not None or not is_concrete(logits, labels, where, temperatures):
        return
    message = suspicious_fit_message(
        logits, labels, where, temperatures, accuracy, simplex
    )
    if message:
        warnings.warn(f"{name}: {message}.", SuspiciousFitWarning, stacklevel=3)
