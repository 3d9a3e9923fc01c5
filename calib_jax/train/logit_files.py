"""The files of a run's exported logits: one per set, or one shard per process.

Their names (:func:`logits_file`, :func:`shard_file`, :func:`set_shards`,
:func:`exported_shifts`) are :mod:`calib_jax.logit_layout`'s, re-exported;
this module writes and reads the arrays.

``<dir>/<set>.npz`` (:func:`logits_file`) holds a set's ``logits [N, K]`` and
``labels [N]`` (and MC dropout's ``mutual_information [N]``), written by a
run of one process. With ``n > 1`` processes each writes its own rows of the
set, ``<dir>/<set>.process-<i>-of-<n>.npz`` (:func:`shard_file`), with their
positions in the set (``rows``): no process ever holds another's logits.
:func:`read_logits` and :func:`read_extras` read either layout, rows in the
set's order; every shard is also an ``.npz`` shard of
:mod:`calib_jax.chunks` (``logits`` and ``labels``), whose concatenation in
process order holds the set's rows, each process's in the set's order.
"""

from __future__ import annotations

import jax
import numpy as np
from etils import epath

from calib_jax import storage

# The file names live in calib_jax.logit_layout, shared with the post-hoc
# command; they stay importable from here.
from calib_jax.logit_layout import (  # noqa: F401
    OOD_KEY,
    ROW_INDEX,
    exported_shifts,
    logits_file,
    set_shards,
    shard_file,
)

# The per-row field MC dropout adds to a set's outputs and its .npz file.
MUTUAL_INFORMATION = "mutual_information"


def export_logits(
    directory: epath.Path,
    logits: dict[str, tuple[np.ndarray, np.ndarray]],
    ood_name: str = "",
    *,
    extras: dict[str, dict[str, np.ndarray]] | None = None,
) -> None:
    """Writes ``logits [n, K]`` and ``labels [n]`` of every set (``.npz``).

    With one process, ``<set>.npz`` holds the whole set (:func:`logits_file`).
    With more, every process calls it with its own rows and writes its shard
    :func:`shard_file`, which also holds the rows' positions in the set
    (``rows``, int64, from ``extras[key][ROW_INDEX]``): no process writes or
    receives another's logits, and :func:`read_logits` puts the rows back in
    the set's order. The OOD set's labels are ``-1`` (it has no class of
    the model). ``extras`` (``{key: {field: [n]}}``; MC dropout's
    ``mutual_information``) become further fields of their set's file.

    Raises:
      ValueError: with more than one process, a set without its row
        positions.
    """
    storage.make_dirs(directory)
    count = jax.process_count()
    for key, (z, y) in logits.items():
        fields = dict((extras or {}).get(key, {}))
        if count == 1:
            name = logits_file(key, ood_name)
        else:
            if ROW_INDEX not in fields:
                raise ValueError(
                    f"export_logits of {key} from {count} processes needs "
                    f"extras[{key!r}][{ROW_INDEX!r}], the rows' positions in the set."
                )
            name = shard_file(key, ood_name, jax.process_index(), count)
        path = directory / name
        if key == OOD_KEY:
            storage.make_dirs(path.parent)
        storage.save_npz(path, logits=z, labels=y, **fields)


def _load_set(directory: epath.Path, key: str, ood_name: str) -> dict[str, np.ndarray]:
    """The exported arrays of set ``key``, rows in the set's order: the file
    :func:`logits_file`, or the shards of :func:`shard_file` put in order by
    their ``rows`` (which is dropped); a missing file is a one-line error."""
    path = directory / logits_file(key, ood_name)
    if path.exists():
        return storage.load_npz(path)
    shards = set_shards(directory, key, ood_name)
    if not shards:
        raise ValueError(f"{path} is missing: the run exported no logits of {key}.")
    parts = [storage.load_npz(p) for p in shards]
    order = np.argsort(np.concatenate([f[ROW_INDEX] for f in parts]), kind="stable")
    names = [name for name in parts[0] if name != ROW_INDEX]
    return {name: np.concatenate([f[name] for f in parts])[order] for name in names}


def read_logits(
    directory: epath.Path, keys: list[str], ood_name: str = ""
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{key: (logits float32, labels int32)}`` of ``keys``, read in that order.

    Reads either layout of :func:`export_logits`: one ``<set>.npz``, or the
    process shards ``<set>.process-<i>-of-<n>.npz`` (rows put back in the
    set's order).

    Raises:
      ValueError: a file or a shard is missing (named).
    """
    out = {}
    for key in keys:
        f = _load_set(directory, key, ood_name)
        out[key] = (
            np.asarray(f["logits"], np.float32),
            np.asarray(f["labels"]).astype(np.int32),
        )
    return out


def read_extras(
    directory: epath.Path, keys: list[str], ood_name: str = ""
) -> dict[str, dict[str, np.ndarray]]:
    """``{key: {'mutual_information': float32 [N]}}`` of the sets of ``keys``
    whose file holds that field (a run with MC dropout); others are left out.

    Raises:
      ValueError: a file or a shard is missing (named).
    """
    out = {}
    for key in keys:
        f = _load_set(directory, key, ood_name)
        if MUTUAL_INFORMATION in f:
            out[key] = {
                MUTUAL_INFORMATION: np.asarray(f[MUTUAL_INFORMATION], np.float32)
            }
    return out
