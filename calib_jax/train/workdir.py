"""A workdir claimed by one config: checked before any write, then recorded.

The trainer (``<workdir>/config.json``) and the benchmark
(``<workdir>/benchmark_config.json``) both keep the resolved config of their
run in the workdir. A rerun with the same config resumes there; a rerun with
another config is refused with one line naming the fields that differ, so two
runs never mix their checkpoints or results. The workdir may be local or in an
object store (``gs://``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import jax
from etils import epath
from ml_collections import ConfigDict

from calib_jax import objectives, storage


def resolved(config: ConfigDict) -> dict:
    """``config`` as the JSON-compatible dict that is written to the workdir."""
    return json.loads(config.to_json_best_effort())


def _as_terms(value):
    """Loss terms in either form as one list of full term dicts (else as given)."""
    try:
        full = objectives.loss_terms(
            objectives.loss_config(objectives.loss_terms(value))
        )
    except (TypeError, ValueError):
        return value  # malformed: compared as written
    return [dict(t) for t in full]


def _with_terms(tree: dict, paths: Iterable[str]) -> dict:
    """``tree`` with the loss fields at dotted ``paths`` as :func:`_as_terms`."""
    out = json.loads(json.dumps(tree))
    for path in paths:
        *parents, key = path.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            node[key] = _as_terms(node[key])
    return out


def claim(
    config: ConfigDict,
    workdir: str | epath.PathLike,
    *,
    filename: str = "config.json",
    resumable: Iterable[str] = (),
    loss_fields: Iterable[str] = (),
    holds: str = "a run of a different config",
    write: bool = True,
) -> epath.Path:
    """Checks that ``workdir`` can hold a run of ``config``; records it if new.

    A ``gs://`` workdir is checked first: a malformed URL, a missing bucket or
    an unreachable store is a one-line ``ValueError`` naming it. A workdir
    that holds ``filename`` must hold a run of the same config, up to the
    top-level keys in ``resumable`` (logging and other settings a resumed run
    may change). ``write=False`` only checks (nothing is created), so that
    every other check can run before the workdir is touched. Only process 0
    writes.

    Args:
      config: the run's config.
      workdir: the directory, local or ``gs://``.
      filename: the file under ``workdir`` that records the resolved config.
      resumable: top-level keys that may differ between a run and its rerun.
      loss_fields: dotted paths of loss terms (``'loss'``), compared as the
        terms they define (:mod:`calib_jax.objectives`): a run recorded with
        the tuple form resumes under the field form of the same terms.
      holds: what a refused workdir holds, for the message (``'a run of a
        different config'``).
      write: whether to create ``workdir`` and write ``filename`` when absent.

    Returns:
      ``workdir`` as an ``epath.Path``.

    Raises:
      ValueError: ``workdir`` is malformed, unreachable or not a directory,
        cannot be created, or holds a run of another config (the differing
        keys are named).
    """
    workdir = storage.as_path(workdir, what="--workdir")
    storage.check_reachable(workdir, what="--workdir")
    path = workdir / filename
    new = resolved(config)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} exists and is not a directory.")
    if path.exists():
        skip = frozenset(resumable)
        old = json.loads(path.read_text())
        old, new = (
            {k: v for k, v in _with_terms(d, loss_fields).items() if k not in skip}
            for d in (old, new)
        )
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise ValueError(
                f"{workdir} holds {holds} (differs in: {', '.join(diff)}); use a "
                "new --workdir or the same config."
            )
        return workdir
    if write and jax.process_index() == 0:
        try:
            storage.make_dirs(workdir)
        except OSError as e:
            msg = f"cannot create --workdir {workdir}: {e.strerror}."
            raise ValueError(msg) from None
        # Written whole (renamed into place, or one upload): another process
        # checking a shared workdir never reads a half-written file.
        storage.write_text(path, json.dumps(new, indent=2, sort_keys=True) + "\n")
    return workdir
