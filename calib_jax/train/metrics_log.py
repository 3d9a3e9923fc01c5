"""``metrics.jsonl``: the step metrics summed on device, their records, and
the writer and reader of the file (local or in an object store)."""

from __future__ import annotations

import json
import os
import time

import jax
from etils import epath

from calib_jax import _cli, storage


class MetricsWriteError(_cli.StorageWriteError):
    """Storage failed while ``metrics.jsonl`` was appended; its message is one line."""


class JsonlWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl`` (process 0).

    In an object store (no append) each write rewrites the file whole. A
    record is written in one call; when storage fails (a full disk), a local
    file is cut back to its last whole record and :class:`MetricsWriteError`
    is raised (a torn line that stays is dropped on resume,
    :meth:`truncate_after`).
    """

    def __init__(self, path: epath.Path):
        self.path = path

    def write(self, step: int, values: dict, *, replace: bool = False) -> None:
        """Appends one record; ``replace``: drops an older one of its step and keys.

        (A finished run that is run again evaluates its last step again.)
        """
        if jax.process_index() != 0:
            return
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({k: float(v) for k, v in values.items()})
        if replace and self.path.exists():
            kind = _kind(row)
            lines = self.path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not _same_record(line, row, kind)]
            if len(kept) != len(lines):
                self._rewrite("".join(kept) + json.dumps(row) + "\n")
                return
        self._append(json.dumps(row) + "\n")

    def _append(self, line: str) -> None:
        remote = storage.is_remote(self.path)
        size = None if remote or not self.path.exists() else os.path.getsize(self.path)
        try:
            storage.append_text(self.path, line)
        except OSError as e:
            if not remote:
                try:  # drop the part of the record that was written
                    os.truncate(self.path, size or 0)
                except OSError:
                    pass  # the reader drops a torn last line on resume
            raise self._failed("append to", e) from None

    def _rewrite(self, text: str) -> None:
        """Replaces the file whole (the old one stays when the write fails)."""
        try:
            storage.write_text(self.path, text)
        except OSError as e:
            raise self._failed("rewrite", e) from None

    def _failed(self, what: str, err: OSError) -> MetricsWriteError:
        return MetricsWriteError(
            f"could not {what} {self.path}: {storage.os_error_text(err)}; free "
            "space and rerun the same command to resume from the last checkpoint."
        )

    def truncate_after(self, step: int) -> None:
        """Drops the records of steps after ``step`` (and a torn last line).

        Called on resume: a run killed after its last checkpoint logged steps
        it will now log again. The file is rewritten whole, only when
        something is dropped.
        """
        if jax.process_index() != 0 or not self.path.exists():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) is not None]
        kept = [line for line in kept if _step_of(line) <= step]
        if len(kept) != len(lines) or (kept and not kept[-1].endswith("\n")):
            self._rewrite("".join(kept))


def _kind(row: dict) -> tuple:
    """What tells records of one step apart: their keys (time aside)."""
    return tuple(sorted(k for k in row if k != "time"))


def _same_record(line: str, row: dict, kind: tuple) -> bool:
    if _step_of(line) != row["step"]:
        return False
    return _kind(json.loads(line)) == kind


def _step_of(line: str) -> int | None:
    """The step of one metrics.jsonl line; None when it is not a whole record."""
    if not line.endswith("\n"):
        return None  # the write of this line was cut short
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) else None


@jax.jit
def _add_metrics(sums: dict, metrics: dict) -> dict:
    """``sums[key] + metrics[key]`` for every key (one compiled program)."""
    return {key: sums[key] + value for key, value in metrics.items()}


def accumulate(acc: dict, metrics: dict) -> dict:
    """Adds one step's metrics to the running sums (on device, no host sync).

    Interleaved training alternates steps with different loss terms, so every
    key keeps its own step count. The additions of one step are one compiled
    program (one dispatch, however many metrics there are).
    """
    # A new key starts from a traced 0.0, as the eager ``0.0 + value`` did.
    sums = _add_metrics({k: acc.get(k, (0.0, 0))[0] for k in metrics}, metrics)
    out = dict(acc)
    for key, total in sums.items():
        out[key] = (total, acc.get(key, (0.0, 0))[1] + 1)
    return out


def summarise(acc: dict) -> dict[str, float]:
    """Turns accumulated step metrics into means (losses) and ratios (sums)."""
    acc = {k: (float(v), n) for k, (v, n) in jax.device_get(acc).items()}
    sums = ("train/count", "train/correct", "train/confidence")
    out = {k: v / n for k, (v, n) in acc.items() if k not in sums}
    if "train/count" in acc:
        count = max(acc["train/count"][0], 1.0)
        out["train/accuracy"] = acc["train/correct"][0] / count
        out["train/confidence"] = acc["train/confidence"][0] / count
    return out


def load_jsonl(path: str | epath.PathLike) -> list[dict]:
    """Reads a metrics.jsonl file (local or in an object store), each record once.

    A step has up to three records, each with its own keys (training
    metrics, a periodic evaluation, the final evaluation). Logs of older runs
    that were resumed after a crash can repeat a record; of records with the
    same step and the same keys only the last is kept, in its place
    (:func:`calib_jax.storage.read_jsonl`: a line cut short is left out).
    """
    rows = storage.read_jsonl(path)
    last = {}
    for i, row in enumerate(rows):
        last[(row.get("step"), _kind(row))] = i
    keep = sorted(last.values())
    return [rows[i] for i in keep]
