"""Per-label temperature scaling of multi-label (sigmoid) logits and its
``.npz`` file. Method and file format: ``docs/posthoc.md``, "Multi-label".
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from calib_jax import _checks, storage
from calib_jax.posthoc import _base, _core, _validate

FORMAT = "calib_jax.posthoc.MultilabelTemperature"
FORMAT_VERSION = 1
NAME = "ts:multilabel"
_HEADER = _base.HEADER
_AUX = ("nll", "nll_at_t1", "num_iter")


def check_inputs(logits, labels, where):
    """Static checks of ``[N, L]`` logits, ``[N, L]`` 0/1 labels and a row
    mask, as ``metrics.multilabel_ece``'s."""
    return _checks.check_multilabel(logits, labels, where, purpose="fitting")


def value_summary(logits, labels, where):
    """``(included, nonfinite rows, first, bad targets, row, label, value)``
    of the included rows (traceable)."""
    num_labels = logits.shape[1]
    valid = jnp.ones(logits.shape[:1], bool) if where is None else where
    bad_row = valid & ~jnp.all(jnp.isfinite(logits), axis=1)
    bad = valid[:, None] & (labels != 0) & (labels != 1)
    flat = jnp.argmax(bad.reshape(-1))
    included, nonfinite = _checks.count_true(valid, bad_row)
    return (
        included,
        nonfinite,
        jnp.argmax(bad_row),
        jnp.sum(bad.astype(jnp.int32)),
        flat // num_labels,
        flat % num_labels,
        labels.reshape(-1)[flat],
    )


def raise_for_summary(summary) -> None:
    """The one-line ValueError a :func:`value_summary` calls for, if any."""
    included, nonfinite, first, bad, row, label, value = jax.device_get(summary)
    if int(included) == 0:
        raise ValueError("where excludes every row: fitting needs at least one sample.")
    if int(nonfinite):
        raise ValueError(
            f"logits contains NaN or inf in {int(nonfinite)} row(s) (first: row "
            f"{int(first)})."
        )
    if int(bad):
        raise ValueError(
            f"labels must be 0 or 1 (one binary target per row and label); found "
            f"{value.item()!r} at row {int(row)}, label {int(label)} ({int(bad)} "
            "target(s) not 0/1)."
        )


def apply_multilabel_temperature(
    logits: jax.typing.ArrayLike, temperatures: jax.typing.ArrayLike
) -> jax.Array:
    r"""Per-label temperature-scaled logits :math:`z_{il} / T_l`.

    .. math::

        \hat p_{il} = \sigma(z_{il} / T_l), \qquad T_l > 0,

    temperature scaling (Sec. 4.2 of [1]) with one temperature per label of a
    sigmoid (multi-label) model. Dividing by :math:`T_l > 0` keeps the sign
    of every logit, so the thresholded predictions at 0.5 do not change.

    Args:
      logits: float ``[..., L]`` sigmoid logits.
      temperatures: float ``[L]`` positive temperatures.

    Returns:
      float ``[..., L]`` calibrated logits (float32 for low-precision input).

    Raises:
      ValueError: ``temperatures`` not of shape ``[L]`` matching the last
        axis of ``logits``; a concrete temperature not finite and > 0.

    References:
      [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, "On Calibration of
      Modern Neural Networks", ICML 2017, arXiv:1706.04599v2, Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import posthoc
      >>> z = jnp.array([[2.0, -3.0]])
      >>> print(posthoc.apply_multilabel_temperature(z, jnp.array([2.0, 0.5])))
      [[ 1. -6.]]
    """
    logits = _checks.check_floating(logits, "logits")
    t = _checks.check_floating(temperatures, "temperatures")
    if t.ndim != 1 or logits.ndim < 1 or logits.shape[-1] != t.shape[0]:
        raise ValueError(
            f"temperatures must have shape [L] with L = logits.shape[-1]; got "
            f"temperatures {t.shape} for logits {logits.shape}."
        )
    _base.check_param_values("temperatures", t, positive=True)
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    t = t.astype(dtype).reshape((1,) * (logits.ndim - 1) + t.shape)
    return logits.astype(dtype) / t


def bce_of_log_t(u, z, y, w):
    r"""Weighted BCE :math:`\sum_n w_n[\mathrm{softplus}(x_n) - y_n x_n]` of
    :math:`x = z e^{-u}`, scalar; convex in :math:`1/T = e^{-u}`."""
    x = z * jnp.exp(-u)
    return jnp.sum(w * (jax.nn.softplus(x) - y * x))


@jax.jit
def _fit(logits, labels, where, tol, max_iter):
    """Per-label temperatures, fit diagnostics and the value summary."""
    valid = jnp.ones(logits.shape[:1], bool) if where is None else where
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    z = jnp.where(valid[:, None], z, jnp.zeros_like(z))
    y = (labels == 1).astype(z.dtype)
    w = _core.mask_weights(valid, z.dtype)

    def one(z_l, y_l):
        z_l, y_l = jax.lax.stop_gradient(z_l), jax.lax.stop_gradient(y_l)

        def objective(u):
            return bce_of_log_t(u, z_l, y_l, w)

        u0 = jnp.zeros((), z.dtype)
        u, info = _core.lbfgs_minimize(objective, u0, max_iter=max_iter, gtol=tol)
        at_one = objective(u0)
        # L-BFGS's line search only accepts decreasing steps; keeping T = 1
        # when rounding says otherwise makes "never worse than T = 1" exact.
        keep = info.value <= at_one
        u = jnp.where(keep, u, u0)
        nll = jnp.where(keep, info.value, at_one)
        return jnp.exp(u), nll, at_one, info.num_iter

    t, nll, nll1, num_iter = jax.vmap(one, in_axes=(1, 1))(z, y)
    aux = {
        "nll": nll.astype(jnp.float32),
        "nll_at_t1": nll1.astype(jnp.float32),
        "num_iter": num_iter.astype(jnp.int32),
    }
    return t.astype(jnp.float32), aux


@jax.jit
def _fit_checked(logits, labels, where, tol, max_iter):
    out = _fit(logits, labels, where, tol, max_iter)
    return out, value_summary(logits, labels, where)


def fit_multilabel_temperature(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> MultilabelTemperature:
    r"""Fits one temperature per label of sigmoid logits; returns the calibrator.

    Temperature scaling (Sec. 4.2 of [1]) applied to every label of a
    multi-label model on its own: label :math:`l` gets

    .. math::

        T_l = \arg\min_{T > 0} \frac{1}{N}\sum_{n}
        \big[\mathrm{softplus}(z_{nl}/T) - y_{nl}\,z_{nl}/T\big],

    the mean binary cross-entropy (Eq. (4) of [1] for one sigmoid), by
    L-BFGS on :math:`u_l = \log T_l` from :math:`T_l = 1`, all labels in one
    jitted call. No label's BCE exceeds its value at :math:`T = 1`. The BCE
    is convex in :math:`1/T`; a label whose logits are anti-correlated with
    its targets gets a large temperature (the infimum is at
    :math:`T \to \infty`). Stopping rule: ``docs/posthoc.md``.

    Args:
      logits: float ``[N, L]`` uncalibrated sigmoid logits (bf16/fp16 are
        upcast).
      labels: ``[N, L]`` 0/1 targets (bool, integer or float).
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: L-BFGS iteration cap per label (traced: no recompile).
      tol: gradient tolerance in :math:`\log T`.

    Returns:
      A :class:`MultilabelTemperature` with ``temperatures`` float32 ``[L]``
      and fit diagnostics in ``aux``: ``nll`` and ``nll_at_t1`` (mean BCE
      per label at the fitted :math:`T_l` and at 1) and ``num_iter``.

    Raises:
      ValueError: labels of another shape than ``logits``, bad options, and
        for concrete inputs NaN/inf logits, labels not 0/1 or a mask
        excluding every row (one line each; under ``jax.jit`` shapes only).

    Warns:
      SuspiciousFitWarning: (concrete inputs only) one line when a fitted
        temperature lies outside [0.05, 20].

    References:
      [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, "On Calibration of
      Modern Neural Networks", ICML 2017, arXiv:1706.04599v2, Sec. 4.2.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import posthoc
      >>> z = jax.random.normal(jax.random.key(0), (2000, 2)) * 2.0
      >>> y = jax.random.bernoulli(jax.random.key(1), jax.nn.sigmoid(z / 2.0))
      >>> cal = posthoc.fit_multilabel_temperature(z * jnp.array([[1.0, 3.0]]), y)
      >>> print([round(float(t), 1) for t in cal.temperatures])
      [1.9, 6.2]
    """
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    _validate.check_nonnegative("tol", tol)
    x, labels, where = check_inputs(logits, labels, where)
    if not _checks.is_concrete(x, labels, where):
        t, aux = _fit(x, labels, where, tol, max_iter)
        return MultilabelTemperature(temperatures=t, aux=aux)
    (t, aux), summary = _fit_checked(x, labels, where, tol, max_iter)
    raise_for_summary(summary)
    _warn_if_outside_range(t)
    return MultilabelTemperature(temperatures=t, aux=aux)


def _warn_if_outside_range(temperatures) -> None:
    """One-line :class:`SuspiciousFitWarning` for temperatures out of range."""
    t = np.asarray(temperatures, np.float64)
    lo, hi = _validate.TEMPERATURE_RANGE
    outside = np.flatnonzero((t < lo) | (t > hi))
    if outside.size:
        first = int(outside[0])
        warnings.warn(
            f"fit_multilabel_temperature: {outside.size} label(s) have a fitted "
            f"temperature outside [{lo}, {hi}] (first: label {first}, T = "
            f"{t[first]:.4g}): T >> 1 when the logits barely predict the targets "
            "(targets misaligned with the logits?), T << 1 for probabilities "
            "passed as logits.",
            _validate.SuspiciousFitWarning,
            stacklevel=3,
        )


@struct.dataclass
class MultilabelTemperature:
    """A fitted per-label temperature scaling of sigmoid logits.

    A pytree (``temperatures`` and ``aux`` are leaves, ``name`` is static),
    so it passes through ``jax.jit`` and comes out of ``jax.vmap`` batched.

    Attributes:
      temperatures: float32 ``[L]`` positive temperatures.
      aux: fit diagnostics (``nll``, ``nll_at_t1``, ``num_iter``, each
        ``[L]``) or None.
      name: ``'ts:multilabel'``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import posthoc
      >>> cal = posthoc.MultilabelTemperature(jnp.array([2.0, 0.5]))
      >>> print(cal.probs(jnp.array([[0.0, 0.0]])))
      [[0.5 0.5]]
    """

    temperatures: jax.Array
    aux: Any = None
    name: str = struct.field(pytree_node=False, default=NAME)

    def apply(self, logits: jax.typing.ArrayLike) -> jax.Array:
        """Calibrated sigmoid logits ``[..., L]`` (:func:`apply_multilabel_temperature`)."""
        return apply_multilabel_temperature(logits, self.temperatures)

    def probs(self, logits: jax.typing.ArrayLike) -> jax.Array:
        """Calibrated positive-class probabilities ``sigmoid(apply(logits))``."""
        return jax.nn.sigmoid(self.apply(logits))

    def summary(self) -> dict[str, Any]:
        """Host-side JSON-serialisable summary, as :meth:`Calibrator.summary`."""
        return _base.summarize({"temperatures": self.temperatures}, self.aux)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Writes the calibrator to ``path`` (``.npz``); :meth:`load` reads it
        back bit-identically.

        Raises:
          ValueError: ``path`` exists and ``overwrite`` is False, or the
            temperatures are not a float ``[L]`` vector (one line).
        """
        path = storage.as_path(path, what="path")
        if path.exists() and not overwrite:
            raise ValueError(
                f"{path} already exists; pass overwrite=True to replace it."
            )
        t = np.asarray(self.temperatures)
        if t.ndim != 1 or t.dtype.kind != "f":
            raise ValueError(
                f"cannot save temperatures of shape {t.shape} and dtype {t.dtype}: "
                "a float [L] vector is needed."
            )
        header = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "name": self.name,
            "num_labels": int(t.shape[0]),
        }
        arrays = {"temperatures": t}
        for key in _AUX:
            if self.aux is not None and key in self.aux:
                arrays[key] = np.asarray(self.aux[key])
        _base.write_archive(path, header, arrays, overwrite=overwrite)

    @classmethod
    def load(cls, path) -> MultilabelTemperature:
        """Reads a calibrator written by :meth:`save`.

        Raises:
          ValueError: a missing or unreadable file, another kind or version,
            temperatures that are not a finite positive float ``[L]`` vector
            or diagnostics of another length (one line naming the file).
        """
        path = storage.as_path(path, what="path")
        if not path.exists() or path.is_dir():
            raise ValueError(
                f"calibrator file {path} does not exist or is a directory."
            )
        try:
            archive = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
            arrays = {k: archive[k] for k in archive.files}
            header = json.loads(str(arrays.pop(_HEADER)[()]))
            kind, version = header.get("format"), header.get("version")
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            EOFError,
            zipfile.BadZipFile,
        ) as err:
            raise ValueError(
                f"{path} is not a saved multi-label calibrator ({type(err).__name__})."
            ) from None
        _base.check_format(
            path, kind, version, expected=FORMAT, expected_version=FORMAT_VERSION
        )
        t = arrays.get("temperatures")
        num_labels = header.get("num_labels")
        if t is None or t.dtype.kind != "f" or t.shape != (num_labels,):
            raise ValueError(
                f"{path} is corrupt: temperatures must be a float [L] vector with "
                f"L = {num_labels!r}."
            )
        try:
            _base.check_param_values("temperatures", t, positive=True)
        except ValueError as err:
            raise ValueError(f"{path} is corrupt: {err}") from None
        aux = {k: jnp.asarray(arrays[k]) for k in _AUX if k in arrays}
        if any(v.shape != t.shape for v in aux.values()) or set(arrays) - {
            "temperatures",
            *_AUX,
        }:
            raise ValueError(
                f"{path} is corrupt: unexpected entries or diagnostics of another "
                "length than the temperatures."
            )
        name = header.get("name")
        return cls(
            temperatures=jnp.asarray(t),
            aux=aux or None,
            name=name if isinstance(name, str) else NAME,
        )
