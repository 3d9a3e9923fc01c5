"""The :class:`Calibrator` pytree and the :class:`Method` description of a
trainable calibration map, shared by every fitter and the registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


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
        """Calibrated logits (or log-probabilities) ``[N, K]``."""
        logits = jnp.asarray(logits)
        logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
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
        from calib_jax.posthoc import _persist

        _persist.save(self, path, overwrite=overwrite)

    def summary(self) -> dict[str, Any]:
        """Host-side summary of the fitted parameters (JSON-serialisable).

        Scalars are reported as floats; arrays by shape, mean, min and max;
        small vectors (at most 8 entries) in full.
        """
        out = {}
        for tree, prefix in ((self.params, ""), (self.aux, "")):
            if tree is None:
                continue
            flat, _ = jax.tree_util.tree_flatten_with_path(tree)
            for path, leaf in flat:
                key = prefix + "/".join(_key_name(k) for k in path)
                out[key] = _describe(np.asarray(leaf))
        return out


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _describe(x: np.ndarray):
    if x.ndim == 0:
        return float(x)
    if x.size <= 8 and x.ndim == 1:
        return [float(v) for v in x]
    return {
        "shape": list(x.shape),
        "mean": float(x.mean()),
        "min": float(x.min()),
        "max": float(x.max()),
    }


class Method(NamedTuple):
    """A trainable calibration map, as used by the class-wise loss scaling.

    All functions are pure; ``weights`` are per-example weights summing to 1
    (the base objective is :math:`\\sum_n \\omega_n \\ell_n`, with
    :math:`\\ell_n` the NLL for every method here).

    Attributes:
      name: registry name of the base method.
      init: ``(logits, labels, weights, key) -> params`` initial parameters.
      train: ``(params, logits, labels, weights, budget) -> params``; ``budget``
        is an int (traced under jit): L-BFGS iterations, or Adam steps for PTS. One unit is
        "one training iteration" in the class-wise scaling (Eq. 6 of
        Jung et al. 2023).
      apply: ``(params, logits) -> calibrated logits``.
      budget: default training budget.
      accuracy_preserving: True when ``apply`` never changes the argmax.
    """

    name: str
    init: Callable
    train: Callable
    apply: Callable
    budget: int
    accuracy_preserving: bool
