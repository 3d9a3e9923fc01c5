"""Shared by the post-hoc methods: :class:`Method`, parameter-tree checks, the
parameter summary and the ``.npz`` archive of saved calibrators."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks, storage

#: The archive entry holding a saved calibrator's JSON header.
HEADER = "__header__"


def summarize(*trees) -> dict[str, Any]:
    """JSON summary of parameter pytrees: scalars, vectors of up to 8 entries
    in full, other arrays by shape, mean, min and max; None trees skipped."""
    out = {}
    for tree in trees:
        if tree is None:
            continue
        flat, _ = jax.tree_util.tree_flatten_with_path(tree)
        for path, leaf in flat:
            out["/".join(_key_name(k) for k in path)] = _describe(np.asarray(leaf))
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


# A map's ``check_*_params(params, *, values) -> K | None``: ``load`` checks values,
# ``Calibrator.apply`` only shapes (jittable). One-line messages, for a prefix.


def param_arrays(params, ranks: dict[str, int], *, bools=()) -> dict[str, Any]:
    """The leaves of a dict with exactly the keys of ``ranks`` (key -> rank),
    bool for the keys in ``bools``, else floating point; ValueError."""
    if not isinstance(params, dict) or set(params) != set(ranks):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params must be a dict with keys {sorted(ranks)}, got {got}.")
    out = {}
    for key, rank in ranks.items():
        out[key] = param_array(params[key], f"params[{key!r}]", rank, key in bools)
    return out


def param_array(leaf, name: str, rank: int, boolean: bool = False):
    """``leaf`` if it is an array of ``rank`` (bool or floating); ValueError."""
    if not isinstance(leaf, (jax.Array, np.ndarray)):
        # ValueError: a saved file that is wrong is one error kind for load.
        raise ValueError(f"{name} must be an array, got {type(leaf).__name__}.")  # noqa: TRY004
    kind = "bool" if boolean else "floating point"
    ok = (
        leaf.dtype == jnp.bool_ if boolean else jnp.issubdtype(leaf.dtype, jnp.floating)
    )
    if not ok:
        raise ValueError(f"{name} must be {kind}, got dtype {leaf.dtype}.")
    if leaf.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {leaf.shape}.")
    return leaf


def same_classes(arrays: dict[str, Any], axes: dict[str, tuple[int, ...]]) -> int:
    """The number of classes ``K >= 2`` shared by ``axes`` (key -> the axes
    of ``arrays[key]`` holding one entry per class)."""
    sizes = {
        f"params[{key!r}].shape[{axis}]": arrays[key].shape[axis]
        for key, key_axes in axes.items()
        for axis in key_axes
    }
    k = next(iter(sizes.values()))
    if any(v != k for v in sizes.values()) or k < 2:
        shapes = ", ".join(f"{key!r}: {arrays[key].shape}" for key in axes)
        raise ValueError(
            f"params must hold one entry per class for K >= 2 classes alike, got "
            f"shapes {shapes}."
        )
    return int(k)


def check_param_values(name: str, leaf, *, positive=False, unit=False, ascending=False):
    """Entries finite (and > 0, in [0, 1], non-decreasing along the last axis
    as asked) of a concrete array; nothing for tracers."""
    if not _checks.is_concrete(leaf):
        return
    v = np.asarray(leaf, np.float64)
    bad = ~np.isfinite(v)
    rule = "finite"
    if positive:
        bad |= ~(v > 0)
        rule = "finite and > 0"
    elif unit:
        bad |= ~((v >= 0) & (v <= 1))
        rule = "in [0, 1]"
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        at = f" at {index}" if index else ""
        raise ValueError(f"{name} must be {rule}, got {v[index]}{at}.")
    if ascending and v.shape[-1] > 1 and (np.diff(v, axis=-1) < 0).any():
        raise ValueError(f"{name} must be non-decreasing along its last axis.")


def check_affine_params(params, *, values: bool = True, matrix: bool) -> int:
    """Vector (``w [K]``) or matrix (``W [K, K]``) and ``b [K]``; returns K."""
    key = "W" if matrix else "w"
    arrays = param_arrays(params, {key: 2 if matrix else 1, "b": 1})
    k = same_classes(arrays, {key: (0, 1) if matrix else (0,), "b": (0,)})
    if values:
        for name, leaf in arrays.items():
            check_param_values(f"params[{name!r}]", leaf)
    return k


def check_vector_params(params, *, values: bool = True) -> int:
    """Vector scaling parameters ``{'w': [K], 'b': [K]}``; returns K."""
    return check_affine_params(params, values=values, matrix=False)


def check_matrix_params(params, *, values: bool = True) -> int:
    """Matrix or Dirichlet parameters ``{'W': [K, K], 'b': [K]}``; returns K."""
    return check_affine_params(params, values=values, matrix=True)


def write_archive(path, header: dict, arrays: dict, *, overwrite: bool) -> None:
    """Writes ``arrays`` and the JSON ``header`` as one ``.npz`` at ``path``."""
    buffer = io.BytesIO()
    np.savez(buffer, **{HEADER: np.array(json.dumps(header))}, **arrays)
    storage.make_dirs(path.parent)
    try:
        storage.write_bytes(path, buffer.getvalue(), exclusive=not overwrite)
    except FileExistsError:
        msg = f"{path} already exists; pass overwrite=True to replace it."
        raise ValueError(msg) from None


def check_format(path, kind, version, *, expected: str, expected_version: int):
    """ValueError unless the header's format is ``expected`` at its version."""
    if kind != expected:
        raise ValueError(
            f"{path} holds a saved object of kind {kind!r}, expected {expected!r}."
        )
    if version != expected_version:
        raise ValueError(
            f"{path} was saved in {expected} format version {version!r}; this "
            f"calib_jax reads version {expected_version}."
        )


class Method(NamedTuple):
    """A trainable calibration map, as used by the class-wise loss scaling.

    All functions are pure; ``weights`` are per-example weights summing to 1
    (the objective is the weighted NLL :math:`\\sum_n \\omega_n \\ell_n`).

    Attributes:
      name: registry name of the base method.
      init: ``(logits, labels, weights, key) -> params`` initial parameters.
      train: ``(params, logits, labels, weights, budget) -> params``; ``budget``
        (traced int): L-BFGS iterations, or Adam steps for PTS; one unit is
        "one training iteration" of Eq. (6) of Jung et al. 2023.
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
