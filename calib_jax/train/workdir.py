"""A workdir claimed by one config: checked before any write, then recorded.

The trainer (``<workdir>/config.json``) and the benchmark
(``<workdir>/benchmark_config.json``) both keep the resolved config of their
run in the workdir. A rerun with the same config resumes there; a rerun with
another config is refused with one line naming the fields that differ, so two
runs never mix their checkpoints or results. Neither accepts a workdir of the
other kind (a training run's ``config.json`` in a benchmark's workdir, or
the reverse). The workdir may be local or in an object store (``gs://``).

While a run works in its workdir it holds the workdir's lock (:func:`lock`),
so a second run of the same command is refused instead of writing every
record twice:

- a local workdir: an exclusive ``flock`` of ``<workdir>/.lock``, which the
  kernel drops when the process ends, however it ends (a SIGKILL or a crash
  leaves no stale lock);
- a ``gs://`` workdir: the object ``<workdir>/.lock``, created only if absent
  (an ``ifGenerationMatch=0`` upload), holding its owner and a lease expiry.
  The holder renews the lease every third of it; a lock whose lease has
  expired (its holder died) is taken over by a write conditional on the
  generation that was read, so two runs can never both take it. A holder
  on the same host whose process has ended (a SIGKILL) is taken over at
  once; one on another host only when its lease expires (at most
  :data:`LEASE_S` after it died). Other object stores are not locked.

In a multi-host run only process 0 takes the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from urllib.parse import quote

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


def _with_added(tree: dict, added: dict) -> dict:
    """``tree`` with each dotted path of ``added`` that it lacks set to its value.

    A config recorded before a field existed holds no entry for it; the run
    it records behaves as the field's value in ``added`` (its default, which
    leaves earlier results unchanged).
    """
    out = json.loads(json.dumps(tree))
    for path, value in added.items():
        *parents, key = path.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key not in node:
            node[key] = json.loads(json.dumps(value))
    return out


def claim(
    config: ConfigDict,
    workdir: str | epath.PathLike,
    *,
    filename: str = "config.json",
    resumable: Iterable[str] = (),
    loss_fields: Iterable[str] = (),
    added: dict | None = None,
    holds: str = "a run of a different config",
    foreign: dict[str, str] | None = None,
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
      added: ``{dotted path: default}`` of the fields added to the config
        since runs were first recorded: a recorded config without one is
        compared as if it held the default (a run recorded by an earlier
        version resumes when the new fields keep their defaults).
      holds: what a refused workdir holds, for the message (``'a run of a
        different config'``).
      foreign: ``{file name: what it marks}`` of the other kinds of run; a
        workdir holding one of these files is refused.
      write: whether to create ``workdir`` and write ``filename`` when absent.

    Returns:
      ``workdir`` as an ``epath.Path``.

    Raises:
      ValueError: ``workdir`` is malformed, unreachable or not a directory,
        is not writable, cannot be created, holds a run of another config
        (the differing keys are named) or another kind of run.
    """
    workdir = storage.as_path(workdir, what="--workdir")
    storage.check_reachable(workdir, what="--workdir")
    path = workdir / filename
    new = resolved(config)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} exists and is not a directory.")
    for name, marks in (foreign or {}).items():
        if (workdir / name).exists():
            raise ValueError(
                f"--workdir {workdir} holds {marks} ({name}); use a new --workdir."
            )
    check_writable(workdir)
    if path.exists():
        skip = frozenset(resumable)
        old = _with_added(json.loads(path.read_text()), added or {})
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
        try:
            storage.write_text(path, json.dumps(new, indent=2, sort_keys=True) + "\n")
        except OSError as e:
            raise ValueError(_unwritable(workdir, e)) from None
    return workdir


def _unwritable(workdir: epath.Path, err: OSError) -> str:
    return f"--workdir {workdir} is not writable: {storage.os_error_text(err)}."


def check_writable(workdir: str | epath.PathLike) -> None:
    """Checks that an existing local ``workdir`` takes new files (before any compute).

    :func:`calib_jax.storage.check_writable` (a probe file written and
    removed); a workdir still to be created, and an object store (whose
    permissions only a write would tell), are left to the first write, which
    fails with the same one line.

    Raises:
      ValueError: one line naming ``workdir`` and the reason (a read-only
        file system, no permission).
    """
    workdir = storage.as_path(workdir, what="--workdir")
    if not storage.is_remote(workdir) and workdir.is_dir():
        storage.check_writable(workdir, what="--workdir")


# ---- the workdir's lock ----------------------------------------------------------

LOCK_FILE = ".lock"
# Seconds a gs:// lock stays valid without renewal (renewed every third).
LEASE_S = 300.0


def _owner() -> str:
    return f"host {socket.gethostname()} pid {os.getpid()}"


def _in_use(workdir: epath.Path, holder: str) -> ValueError:
    return ValueError(
        f"--workdir {workdir} is in use by another run ({holder}); wait for it to "
        "end or use another --workdir."
    )


class WorkdirLock:
    """A workdir's lock, held until :meth:`release` (or the ``with`` block's end)."""

    def release(self) -> None:
        """Gives the lock up (a no-op when released already)."""

    def __enter__(self) -> WorkdirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _FileLock(WorkdirLock):
    """``flock`` of a local file; the kernel releases it when the process ends."""

    def __init__(self, workdir: epath.Path):
        path = workdir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ValueError(_unwritable(workdir, e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                msg = f"cannot lock --workdir {workdir}: {e.strerror}."
                raise ValueError(msg) from None
            raise _in_use(workdir, holder or "its owner is not recorded") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (_owner() + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


def _died_here(content: dict) -> bool:
    """Whether a lock's holder ran on this host and its process has ended."""
    pid = content.get("pid")
    if content.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, owned by another user
        return False
    return False


class _ObjectLock(WorkdirLock):
    """A GCS lock object written under generation preconditions, with a lease."""

    def __init__(self, workdir: epath.Path, lease_s: float):
        import fsspec.asyn  # noqa: PLC0415 - gcsfs is needed only for gs://
        import fsspec.core  # noqa: PLC0415

        self._workdir = workdir
        self._fs, root = fsspec.core.url_to_fs(os.fspath(workdir / LOCK_FILE))
        self._bucket, _, self._key = root.partition("/")
        self._sync = lambda fn, *a, **kw: fsspec.asyn.sync(self._fs.loop, fn, *a, **kw)
        self._lease_s = float(lease_s)
        self._owner = _owner()
        try:
            self._generation = self._put(0)
        except FileExistsError:
            self._generation = self._take_over()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name="workdir-lock", daemon=True
        )
        self._thread.start()

    def _put(self, generation: int) -> int:
        """Uploads a fresh lease if the object's generation is ``generation``.

        Raises ``FileExistsError`` (HTTP 412) when it is not (0: absent).
        """
        body = json.dumps(
            {
                "owner": self._owner,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "expires": time.time() + self._lease_s,
            }
        ).encode()
        out = self._sync(
            self._fs._call,
            "POST",
            f"{self._fs._location}/upload/storage/v1/b/{quote(self._bucket)}/o",
            uploadType="media",
            name=self._key,
            ifGenerationMatch=str(generation),
            data=body,
            headers={"Content-Type": "application/octet-stream"},
            json_out=True,
        )
        return int(out["generation"])

    def _read(self) -> tuple[dict, int] | None:
        """The lock object's content and generation; None when it is absent."""
        try:
            headers, data = self._sync(
                self._fs._call, "GET", "b/{}/o/{}", self._bucket, self._key, alt="media"
            )
        except FileNotFoundError:
            return None
        try:
            content = json.loads(data)
        except ValueError:
            content = {}
        return (content if isinstance(content, dict) else {}), int(
            headers.get("x-goog-generation", headers.get("X-Goog-Generation", 0))
        )

    def _take_over(self) -> int:
        """Takes the lock of a holder whose lease expired; else refuses."""
        found = self._read()
        if found is None:  # released meanwhile
            generation = 0
        else:
            content, generation = found
            expires = content.get("expires")
            left = (
                float(expires) - time.time()
                if isinstance(expires, (int, float))
                else -1.0
            )
            if left > 0 and not _died_here(content):
                owner = content.get("owner", "owner unknown")
                holder = f"{owner}, lease ends in {left:.0f} s"
                raise _in_use(self._workdir, holder)
        try:
            return self._put(generation)
        except FileExistsError:  # another run took it first
            raise _in_use(self._workdir, "it took the lock just now") from None

    def _renew(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            try:
                self._generation = self._put(self._generation)
            except FileExistsError:
                logging.warning(
                    "the lock of %s was taken over by another run.", self._workdir
                )
                return
            except Exception as e:  # noqa: BLE001 - retried at the next renewal
                logging.warning("could not renew the lock of %s: %s", self._workdir, e)

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            self._sync(
                self._fs._call,
                "DELETE",
                "b/{}/o/{}",
                self._bucket,
                self._key,
                ifGenerationMatch=str(self._generation),
            )
        except Exception as e:  # noqa: BLE001 - the lease expires anyway
            logging.warning("could not release the lock of %s: %s", self._workdir, e)


def lock(workdir: str | epath.PathLike, *, lease_s: float = LEASE_S) -> WorkdirLock:
    """Takes the lock of ``workdir`` (which must exist, if local) for this run.

    Process 0 only (the other processes of a multi-host run get a lock that
    holds nothing). See the module docstring for how each kind of storage
    is locked.

    Args:
      workdir: the run's workdir, local or ``gs://``.
      lease_s: the lease of a ``gs://`` lock, in seconds.

    Returns:
      The held lock; release it with :meth:`WorkdirLock.release` or ``with``.

    Raises:
      ValueError: another run holds the lock (one line naming its owner), or
        the lock file cannot be created.
    """
    workdir = storage.as_path(workdir, what="--workdir")
    if jax.process_index() != 0:
        return WorkdirLock()
    if not storage.is_remote(workdir):
        return _FileLock(workdir)
    if os.fspath(workdir).startswith("gs://"):
        return _ObjectLock(workdir, lease_s)
    return WorkdirLock()
