"""The file names of a run's exported logits: one file per set, or one shard
per process.

A run of one process writes set ``key``'s ``logits [N, K]`` and ``labels
[N]`` to ``<dir>/<set>.npz`` (:func:`logits_file`). A run of ``n > 1``
processes writes one shard per process, ``<dir>/<set>.process-<i>-of-<n>.npz``
(:func:`shard_file`), holding that process's rows and their positions in the
set (:data:`ROW_INDEX`). The trainer's export (:mod:`calib_jax.train`) and the
post-hoc command (:mod:`calib_jax.posthoc`) both name and find the files
here: :func:`set_shards` lists a set's shards in process order and checks
that all ``n`` of them are present; :func:`exported_shifts` lists the
shifted test sets of a directory in either layout. Names only: nothing here
reads an array.
"""

from __future__ import annotations

from etils import epath

# The set of out-of-distribution inputs (its files live under ood/).
OOD_KEY = "ood"
# The field of a process's shard that holds its rows' positions in the set
# (int64 [n]).
ROW_INDEX = "rows"
_SUFFIX = ".npz"
_PROCESS = ".process-"
_OF = "-of-"


def logits_file(key: str, ood_name: str = "") -> str:
    """The file of set ``key`` under a logits directory.

    ``val.npz``, ``test.npz``, ``shift_<corruption>_<severity>.npz`` (set
    ``shift/<corruption>/<severity>``) and ``ood/<ood_name>.npz`` (a
    subdirectory: readers of the shift files never take the OOD set for a
    shifted test set).
    """
    if key == OOD_KEY:
        return f"{OOD_KEY}/{ood_name}{_SUFFIX}"
    return key.replace("/", "_") + _SUFFIX


def shard_file(key: str, ood_name: str, process: int, count: int) -> str:
    """Process ``process``'s shard of set ``key`` (of ``count`` processes):
    :func:`logits_file` with ``.process-<i>-of-<n>`` before ``.npz``
    (``test.process-0-of-2.npz``)."""
    stem = logits_file(key, ood_name)[: -len(_SUFFIX)]
    return f"{stem}{_PROCESS}{process}{_OF}{count}{_SUFFIX}"


def shard_glob(key: str, ood_name: str = "") -> str:
    """The glob of set ``key``'s process shards (``test.process-*-of-*.npz``)."""
    stem = logits_file(key, ood_name)[: -len(_SUFFIX)]
    return f"{stem}{_PROCESS}*{_OF}*{_SUFFIX}"


def set_shards(directory: epath.Path, key: str, ood_name: str = "") -> list[epath.Path]:
    """The process shards of set ``key`` under ``directory``, in process order
    (``process-0``, ``process-1``, ..., ``process-10``: by index, not by
    name); ``[]`` when there are none.

    Raises:
      ValueError: shards of different process counts, or one of the ``n``
        shards of ``-of-<n>`` missing (one line naming the missing file).
    """
    single = directory / logits_file(key, ood_name)
    stem = single.name[: -len(_SUFFIX)]
    found = {}
    for path in single.parent.glob(shard_glob(key, ood_name).rpartition("/")[2]):
        i, _, n = path.name[len(stem) + len(_PROCESS) : -len(_SUFFIX)].partition(_OF)
        if i.isdigit() and n.isdigit():
            found[(int(i), int(n))] = path
    if not found:
        return []
    counts = sorted({n for _, n in found})
    if len(counts) > 1:
        raise ValueError(
            f"{single.parent} holds shards of {key} from {counts} processes; "
            "expected the shards of one run."
        )
    n = counts[0]
    missing = [i for i in range(n) if (i, n) not in found]
    if missing:
        name = shard_file(key, ood_name, missing[0], n).rpartition("/")[2]
        raise ValueError(
            f"{single.parent / name} is missing: the export of {key} needs all "
            f"{n} process shards ({len(missing)} missing)."
        )
    return [found[(i, n)] for i in range(n)]


def exported_shifts(directory: epath.Path) -> list[tuple[str, int]]:
    """``(corruption, severity)`` of every shifted set exported under
    ``directory`` (``shift_*.npz`` files or their process shards), sorted."""
    out = set()
    for path in directory.glob(f"shift_*{_SUFFIX}"):
        stem = path.name[len("shift_") : -len(_SUFFIX)].partition(_PROCESS)[0]
        corruption_name, _, severity = stem.rpartition("_")
        if corruption_name and severity.isdigit():
            out.add((corruption_name, int(severity)))
    return sorted(out)
