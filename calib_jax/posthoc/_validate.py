"""The post-hoc extras to the checking contract of :mod:`calib_jax._checks`.

Static checks (ranks, shapes, dtypes, ``N >= 1``, ``K >= 2``) run on every
call, also while tracing under ``jax.jit``/``jax.vmap``. Value checks (NaN/inf
logits, labels out of range, a mask excluding every row, non-positive
temperatures) run only on concrete arrays, i.e. in eager host code; the
jitted cores never inspect values. Every message is one line.
"""

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
    """Checks ``(logits [N, K], labels [N], where [N] | None)``.

    Args:
      logits: float ``[N, K]``.
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are excluded and not
        value-checked.
      name: how ``logits`` is called in messages (e.g. ``'val logits'``).
      values: whether to check the values of concrete inputs here. A fitter
        that reads the logits in a compiled call anyway passes False and
        computes :func:`value_summary` inside that call (one read of the
        logits instead of two), then calls :func:`raise_for_values`.

    Returns:
      ``(logits, labels, where)`` as JAX arrays (``where`` may stay None).

    Raises:
      TypeError: non-floating logits, non-integer labels, non-bool ``where``.
      ValueError: wrong ranks, ``N = 0``, ``K < 2``, mismatched lengths and,
        for concrete inputs, NaN/inf logits, labels out of range or a mask
        excluding every row.
    """
    logits, labels, where = _checks.check_scores_labels(
        logits, labels, where, name=name, purpose="fitting"
    )
    if values:
        _checks.check_values(logits, labels, where, name=name, family="fit")
    return logits, labels, where


def value_summary(logits, labels, where):
    """:func:`calib_jax._checks.value_summary` of a fitter's inputs (traceable):
    computed inside the fitter's own compiled call, it shares that call's read
    of the logits."""
    return _checks.value_summary(logits, labels, where)


def raise_for_values(summary, shape, *, name: str = "logits") -> None:
    """Raises the one-line ValueError that :func:`value_summary` calls for.

    Args:
      summary: the output of :func:`value_summary` (fetched here).
      shape: the logits' shape ``(N, K)``.
      name: how the logits are called in the message.
    """
    _checks.raise_for_values(summary, shape[1], name=name, family="fit")


def screen_summary(logits, labels, where):
    """:func:`value_summary` with rows screened by their sum (traceable).

    A row with NaN/inf has a non-finite sum; so may a finite row of huge
    logits (beyond ``float max / K``), which :func:`raise_for_screen` then
    re-checks exactly. A plain row sum runs at memory speed on XLA:CPU where
    ``all(isfinite(x), axis=1)`` does not.
    """
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


# ---------------------------------------------------------------------------
# Warnings for fits that look wrong (misaligned labels, probabilities as logits)
# ---------------------------------------------------------------------------

#: Fitted temperatures outside this range trigger :class:`SuspiciousFitWarning`.
TEMPERATURE_RANGE = (0.05, 20.0)


class SuspiciousFitWarning(UserWarning):
    """A fit whose inputs look wrong: validation accuracy below chance, a
    fitted temperature outside :data:`TEMPERATURE_RANGE`, or inputs whose
    rows are probability vectors rather than logits."""


class _Diagnostics:
    """Fit diagnostics reported inside :func:`quiet_fit_warnings`, by inputs.

    A fitter that computed the validation accuracy and the simplex flag in
    its own compiled call reports them for the exact input objects it was
    given; ``posthoc.fit`` reuses them for the same objects instead of
    reading the logits again.
    """

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
    """Silences :func:`warn_if_suspicious` inside (``posthoc.fit`` warns once
    for the whole calibrator instead of once per inner fitter); yields the
    diagnostics the inner fitters reported (:func:`report_diagnostics`)."""
    diagnostics = _Diagnostics()
    token = _QUIET.set(diagnostics)
    try:
        yield diagnostics
    finally:
        _QUIET.reset(token)


def report_diagnostics(inputs, accuracy, simplex) -> None:
    """Records the validation accuracy (None: not computed) and simplex flag
    a fitter computed for ``inputs`` (the caller's ``(logits, labels, where)``
    objects) for the enclosing :func:`quiet_fit_warnings`; nothing outside
    one."""
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
    """The reasons a fit looks wrong, joined in one line, or None.

    Args:
      logits: concrete float ``[N, K]`` validation logits.
      labels: concrete int ``[N]``.
      where: optional bool ``[N]``.
      temperatures: optional fitted temperature(s), scalar or array.
      accuracy: the validation accuracy if the fitter already has it (saves
        an arg-max pass).
      simplex: whether the first rows look like probabilities, if the fitter
        already has it (:func:`simplex_rows`).
    """
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
    """Warns (:class:`SuspiciousFitWarning`, one line) when a fit looks wrong.

    Checks concrete inputs only (nothing under ``jax.jit``/``jax.vmap``) and
    nothing inside :func:`quiet_fit_warnings`. See
    :func:`suspicious_fit_message` for the conditions.

    Args:
      logits, labels, where: the validation data of the fit.
      name: what was fitted, first in the message (e.g. ``'fit_temperature'``).
      temperatures: optional fitted temperature(s).
      accuracy: optional validation accuracy already computed by the fitter.
      simplex: optional simplex flag already computed by the fitter
        (:func:`simplex_rows`).
    """
    if _QUIET.get() is not None or not is_concrete(logits, labels, where, temperatures):
        return
    message = suspicious_fit_message(
        logits, labels, where, temperatures, accuracy, simplex
    )
    if message:
        warnings.warn(f"{name}: {message}.", SuspiciousFitWarning, stacklevel=3)
