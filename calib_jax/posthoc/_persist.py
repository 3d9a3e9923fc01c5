r"""Saving and loading fitted calibrators: :meth:`Calibrator.save` and
:func:`load`.

File format (``FORMAT_VERSION`` 1): one NumPy ``.npz`` archive (a zip of
``.npy`` files, readable without calib_jax), written and read through
``etils.epath`` (local paths, ``gs://`` and other object stores alike):

- ``__header__``: a 0-d unicode array holding a JSON object with
  ``format`` (``"calib_jax.posthoc.Calibrator"``), ``version`` (1),
  ``name`` (the registry name, e.g. ``"ts:nll"``), ``apply`` (the key of
  the calibration map in :data:`APPLY_KEYS`, e.g. ``"ets(logit)"``), and
  ``params`` and ``aux``: the structure of the two pytrees;
- ``p0, p1, ...`` and ``a0, a1, ...``: the array leaves of ``params`` and
  ``aux``, in the order of the structure.

A structure node is one of ``{"dict": [[key, node], ...]}`` (string keys,
insertion order), ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"none":
true}``, ``{"bool" | "int" | "float" | "str": value}`` (Python scalars; JSON
writes floats with ``repr``, which reads back exactly) and ``{"array": key,
"kind": "jax" | "numpy" | "numpy_scalar", "dtype": name}`` (an array entry
of the archive; dtypes NumPy cannot store natively, such as bfloat16, are
stored as unsigned integers of the same width and viewed back). Loading
rebuilds every leaf with its type, dtype and bits, so a loaded calibrator
gives bit-identical outputs. No pickle is involved in either direction.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "calib_jax.posthoc.Calibrator"
FORMAT_VERSION = 1
_HEADER = "__header__"


def _apply_table() -> dict[str, Callable]:
    """Key -> calibration map of every calibrator the library fits."""
    from calib_jax.posthoc import (
        _binary,
        _cts,
        _dirichlet,
        _ets,
        _histogram,
        _isotonic,
        _matrix,
        _pts,
        _temperature,
    )

    return {
        "ts": _temperature.apply_ts_params,
        "ets": _ets.apply_fn("original"),
        "ets(logit)": _ets.apply_fn("logit"),
        "pts": _pts.apply_pts_params,
        "cts": _cts.apply_cts_params,
        "vector": _matrix.apply_vector_params,
        "matrix": _matrix.apply_matrix_params,
        "dirichlet": _dirichlet.apply_dirichlet_params,
        "histogram_binning(top_label)": _histogram.apply_top_label,
        "histogram_binning(one_vs_rest)": _histogram.apply_one_vs_rest,
        "isotonic(top_label)": _isotonic.apply_top_label,
        "isotonic(one_vs_rest)": _isotonic.apply_one_vs_rest,
        "platt": _binary.apply_platt_params,
        "beta": _binary.apply_beta_params,
    }


def apply_keys() -> tuple[str, ...]:
    """The calibration maps a saved file can name (its ``apply`` field)."""
    return tuple(_apply_table())


def _storable(dtype: np.dtype) -> bool:
    return dtype.kind in "biufc" and dtype.isnative


def _encode(tree, prefix: str, arrays: dict) -> dict:
    if isinstance(tree, dict):
        bad = [k for k in tree if not isinstance(k, str)]
        if bad:
            raise ValueError(f"cannot save a dict with non-string key {bad[0]!r}.")
        return {"dict": [[k, _encode(v, prefix, arrays)] for k, v in tree.items()]}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_encode(v, prefix, arrays) for v in tree]}
    if tree is None:
        return {"none": True}
    if isinstance(tree, (bool, int, float, str)):
        return {type(tree).__name__: tree}
    if isinstance(tree, (jax.Array, np.ndarray, np.generic)):
        kind = (
            "jax"
            if isinstance(tree, jax.Array)
            else "numpy"
            if isinstance(tree, np.ndarray)
            else "numpy_scalar"
        )
        value = np.asarray(tree)
        node = {
            "array": f"{prefix}{len(arrays)}",
            "kind": kind,
            "dtype": value.dtype.name,
        }
        if not _storable(value.dtype):
            value = value.view(np.dtype(f"u{value.dtype.itemsize}"))
        arrays[node["array"]] = value
        return node
    raise ValueError(
        f"cannot save a leaf of type {type(tree).__name__}: a calibrator's params "
        "and aux hold arrays, Python scalars, None, dicts, lists and tuples."
    )


def _decode(node: dict, arrays):
    kind = "array" if "array" in node else next(iter(node))
    if kind == "dict":
        return {k: _decode(v, arrays) for k, v in node["dict"]}
    if kind in ("list", "tuple"):
        items = [_decode(v, arrays) for v in node[kind]]
        return items if kind == "list" else tuple(items)
    if kind == "none":
        return None
    if kind in ("bool", "int", "float", "str"):
        return {"bool": bool, "int": int, "float": float, "str": str}[kind](node[kind])
    if kind == "array":
        value = arrays[node["array"]]
        dtype = np.dtype(jnp.dtype(node["dtype"]))
        if value.dtype != dtype:
            value = value.view(dtype)
        if node["kind"] == "jax":
            return jnp.asarray(value)
        return value[()] if node["kind"] == "numpy_scalar" else value
    raise ValueError(f"unknown node {kind!r}")


def save(calibrator, path, *, overwrite: bool = False) -> None:
    """Writes ``calibrator`` to ``path`` (see the module docstring)."""
    from etils import epath

    path = epath.Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True to replace it.")
    table = _apply_table()
    key = next((k for k, fn in table.items() if fn is calibrator.apply_fn), None)
    if key is None:
        raise ValueError(
            f"cannot save calibrator {calibrator.name!r}: its apply_fn is not a "
            f"calibration map of calib_jax.posthoc (known: {', '.join(table)})."
        )
    arrays: dict[str, np.ndarray] = {}
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "name": calibrator.name,
        "apply": key,
        "params": _encode(calibrator.params, "p", arrays),
        "aux": _encode(calibrator.aux, "a", arrays),
    }
    buffer = io.BytesIO()
    np.savez(buffer, **{_HEADER: np.array(json.dumps(header))}, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def load(path, *, name: str | None = None):
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
        map, or a name other than ``name`` (one line naming the file).
    """
    from etils import epath

    from calib_jax.posthoc._calibrator import Calibrator

    path = epath.Path(path)
    if not path.exists():
        raise ValueError(f"calibrator file {path} does not exist.")
    if path.is_dir():
        raise ValueError(f"calibrator path {path} is a directory, not a file.")
    try:
        archive = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
        files = set(archive.files)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(
            f"{path} is not a saved calibrator (not a readable .npz archive: "
            f"{type(err).__name__})."
        ) from None
    if _HEADER not in files:
        raise ValueError(
            f"{path} is not a saved calibrator: it has no {_HEADER} entry "
            f"(entries: {', '.join(sorted(files)) or 'none'})."
        )
    try:
        header = json.loads(str(archive[_HEADER][()]))
        kind, version = header.get("format"), header.get("version")
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{path} has an unreadable {_HEADER} entry.") from None
    if kind != FORMAT:
        raise ValueError(
            f"{path} holds a saved object of kind {kind!r}, expected {FORMAT!r}."
        )
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} was saved in {FORMAT} format version {version!r}; this "
            f"calib_jax reads version {FORMAT_VERSION}."
        )
    table = _apply_table()
    if header.get("apply") not in table:
        raise ValueError(
            f"{path} names an unknown calibration map {header.get('apply')!r} "
            f"(known: {', '.join(table)})."
        )
    if name is not None and header.get("name") != name:
        raise ValueError(
            f"{path} holds calibrator {header.get('name')!r}, expected {name!r}."
        )
    try:
        arrays = {k: archive[k] for k in files - {_HEADER}}
        params = _decode(header["params"], arrays)
        aux = _decode(header["aux"], arrays)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(
            f"{path} is corrupt: its arrays do not match its header ({err!r})."
        ) from None
    return Calibrator(
        params=params, aux=aux, name=header["name"], apply_fn=table[header["apply"]]
    )
