"""The ``.npz`` file of a fitted calibrator: :func:`save` and :func:`read`
(behind :func:`calib_jax.posthoc.load`). Format (version 1) and errors:
``docs/posthoc.md``, "Saving and loading". Reading trusts nothing in the file.
"""

from __future__ import annotations

import io
import json
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from calib_jax import storage
from calib_jax.posthoc import _base, _methods

FORMAT = "calib_jax.posthoc.Calibrator"
FORMAT_VERSION = 1
_HEADER = _base.HEADER


def _family(name: str) -> str:
    """``'ts'`` of ``'ts:nll+classwise'``, ``'isotonic'`` of
    ``'isotonic(one_vs_rest)'``."""
    for sep in ":(+":
        name = name.split(sep)[0]
    return name


def _name_fits(name, key: str) -> bool:
    """Whether a registry name can have the calibration map ``key``."""
    if not isinstance(name, str) or _family(name) != _family(key):
        return False
    variant = name.partition("(")[2].partition(")")[0]
    return not variant or variant == key.partition("(")[2].partition(")")[0]


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


# Deeper structures are refused (a tampered header could exhaust the recursion).
_MAX_DEPTH = 32
_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}
_ARRAY_KINDS = ("jax", "numpy", "numpy_scalar")


def _decode(node, arrays, depth: int = 0):
    """The pytree a structure node describes; ValueError for a bad node."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"the structure is nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(node, dict) or not node:
        raise ValueError(
            f"a structure node must be a non-empty object, got {node!r:.40}"
        )
    if "array" in node:
        return _decode_array(node, arrays)
    if len(node) != 1:
        raise ValueError(f"a structure node must have one key, got {sorted(node)}")
    kind, value = next(iter(node.items()))
    if kind == "dict":
        if not isinstance(value, list) or not all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) for e in value
        ):
            raise ValueError("a dict node must list [key, node] pairs")
        return {k: _decode(v, arrays, depth + 1) for k, v in value}
    if kind in ("list", "tuple"):
        if not isinstance(value, list):
            raise ValueError(f"a {kind} node must hold a list")
        items = [_decode(v, arrays, depth + 1) for v in value]
        return items if kind == "list" else tuple(items)
    if kind == "none" and value is True:
        return None
    if kind in _SCALARS and type(value) is _SCALARS[kind]:
        return value
    raise ValueError(f"unknown structure node {kind!r} = {value!r:.40}")


def _decode_array(node, arrays):
    """An array leaf of the header's dtype (or its unsigned stand-in)."""
    if set(node) != {"array", "kind", "dtype"} or node["kind"] not in _ARRAY_KINDS:
        raise ValueError(f"bad array node {node!r:.80}")
    if node["array"] not in arrays:
        raise ValueError(f"array entry {node['array']!r} is missing")
    value = arrays[node["array"]]
    try:
        dtype = np.dtype(jnp.dtype(node["dtype"]))
    except TypeError:
        raise ValueError(f"unknown dtype {node['dtype']!r:.40}") from None
    if value.dtype != dtype:
        stand_in = np.dtype(f"u{dtype.itemsize}")
        if _storable(dtype) or value.dtype != stand_in:
            raise ValueError(
                f"array entry {node['array']!r} is stored as {value.dtype}, but "
                f"the header says {dtype}"
            )
        value = value.view(dtype)
    if node["kind"] == "jax":
        return jnp.asarray(value)
    if node["kind"] == "numpy_scalar":
        if value.ndim:
            raise ValueError(
                f"array entry {node['array']!r} has shape {value.shape}, but the "
                "header says scalar"
            )
        return value[()]
    return value


def save(calibrator, path, *, overwrite: bool = False) -> None:
    """Writes ``calibrator`` to ``path`` whole, under a temporary name renamed
    into place (never a truncated file)."""
    path = storage.as_path(path, what="path")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists; pass overwrite=True to replace it.")
    maps = _methods.MAPS
    key = next((k for k, m in maps.items() if m.apply is calibrator.apply_fn), None)
    if key is None:
        raise ValueError(
            f"cannot save calibrator {calibrator.name!r}: its apply_fn is not a "
            f"calibration map of calib_jax.posthoc (known: {', '.join(maps)})."
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
    _base.write_archive(path, header, arrays, overwrite=overwrite)


def read(path, *, name: str | None = None):
    """``(name, map key, params, aux)`` of a file written by :func:`save`."""
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
    except (
        ValueError,
        TypeError,
        AttributeError,
        RecursionError,
        OSError,
        EOFError,
        zipfile.BadZipFile,
    ):
        raise ValueError(f"{path} has an unreadable {_HEADER} entry.") from None
    _base.check_format(
        path, kind, version, expected=FORMAT, expected_version=FORMAT_VERSION
    )
    maps = _methods.MAPS
    key = header.get("apply")
    if not isinstance(key, str) or key not in maps:
        raise ValueError(
            f"{path} names an unknown calibration map {key!r:.60} "
            f"(known: {', '.join(maps)})."
        )
    if not _name_fits(header.get("name"), key):
        raise ValueError(
            f"{path} is corrupt: calibrator name {header.get('name')!r:.60} does not "
            f"fit its calibration map {key!r}."
        )
    if name is not None and header.get("name") != name:
        raise ValueError(
            f"{path} holds calibrator {header.get('name')!r}, expected {name!r}."
        )
    try:
        arrays = {k: archive[k] for k in files - {_HEADER}}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{path} is corrupt: an array entry does not read back "
            f"({type(err).__name__})."
        ) from None
    try:
        params = _decode(header.get("params"), arrays)
        aux = _decode(header.get("aux"), arrays)
    except ValueError as err:
        raise ValueError(
            f"{path} is corrupt: its arrays do not match its header ({err})."
        ) from None
    try:
        maps[key].check(params, values=True)
    except ValueError as err:
        raise ValueError(
            f"{path} is corrupt: bad parameters for calibration map {key!r}: {err}"
        ) from None
    return header["name"], key, params, aux
