"""Inputs and outputs of ``python -m calib_jax.posthoc``: ``.npz`` files or
shards, a workdir's exported logits, and the output directory; every user
error is a one-line :class:`UserError`."""

from __future__ import annotations

import io
import zipfile
import zlib
from typing import NamedTuple

import numpy as np
from etils import epath

from calib_jax import _cli, _memory, chunks, logit_layout, storage
from calib_jax._cli import UserError
from calib_jax.posthoc import _matrix

TABLE = "table.md"
RESULTS = "results.json"
CALIBRATED = "calibrated"
CALIBRATORS = "calibrators"
# Bytes per class and bin of the metrics' class-wise bins.
_BIN_BYTES = 20
# Methods that fit a [K, K] matrix by L-BFGS.
_SQUARE = ("matrix", "dirichlet")


class StorageError(_cli.StorageWriteError):
    """An output that could not be written (exit status 4)."""

    def __str__(self) -> str:
        return (
            f"{super().__str__()} No output of this run was kept; rerun once the "
            "storage is writable."
        )


class Split(NamedTuple):
    """One set of logits to score.

    Attributes:
      key: ``'val'``, ``'test'`` or ``'shift/<corruption>/<severity>'``.
      file: file name of its calibrated logits (``'val.npz'``).
      path: where its logits are read from (None for process shards).
      what: how messages name it (``"--val file 'v.npz'"``).
      shards: the ``--val``/``--test`` value or the process shards, or None.
      label: the glob the table prints for process shards, else None.
    """

    key: str
    file: str
    path: epath.Path | None
    what: str
    shards: str | tuple[str, ...] | None = None
    label: str | None = None

    @property
    def source_name(self) -> str:
        """The input as the table prints it."""
        if self.shards is None:
            return str(self.path)
        return self.label if self.label is not None else str(self.shards)


def is_shards(value: str) -> bool:
    """Whether a ``--val`` value names shards rather than one ``.npz``."""
    return glob_magic(value) or "," in value or value.endswith(".npy")


def glob_magic(value: str) -> bool:
    """Whether ``value`` holds a glob wildcard (``*``, ``?``, ``[``)."""
    return any(c in value for c in "*?[")


def shard_source(split: Split) -> chunks.ChunkSource:
    """The chunk source of a sharded split; a UserError naming a bad shard."""
    spec = split.shards
    if isinstance(spec, tuple):
        paths, flag = list(spec), "--workdir"
    else:
        paths = spec if glob_magic(spec) else [p for p in spec.split(",") if p]
        flag = f"--{split.key}"
    try:
        return chunks.ChunkSource(paths, key="logits", progress_bar=False)
    except ValueError as err:
        raise UserError(f"{flag}: {err}") from None


def as_path(value: str, what: str) -> epath.Path:
    """Parses a path flag; a malformed URL or unreachable bucket is a UserError."""
    try:
        path = storage.as_path(value, what=what)
        storage.check_reachable(path, what=what)
    except ValueError as err:
        raise UserError(str(err)) from None
    return path


def file_name(method: str) -> str:
    """File-system-safe name of a method's outputs: ``'ts:nll'`` -> ``'ts_nll'``."""
    return method.replace(":", "_")


def given_splits(val: str, test: str) -> list[Split]:
    """The ``--val``/``--test`` pair as splits (the files must exist)."""
    splits = []
    for key, value in (("val", val), ("test", test)):
        if is_shards(value):
            what = f"--{key} shards {value!r}"
            splits.append(Split(key, f"{key}.npz", None, what, value))
            continue
        path = as_path(value, f"--{key}")
        what = f"--{key} file {value!r}"
        if not path.exists():
            raise UserError(f"{what} does not exist.")
        splits.append(Split(key, f"{key}.npz", path, what))
    return splits


def _exported(logits: epath.Path, key: str) -> Split | None:
    """Set ``key`` of a run's ``logits/`` (its file or process shards), or None."""
    name = logit_layout.logits_file(key)
    path = logits / name
    if path.exists():
        return Split(key, name, path, f"--workdir file {str(path)!r}")
    try:
        shards = logit_layout.set_shards(logits, key)
    except ValueError as err:
        raise UserError(f"--workdir: {err}") from None
    if not shards:
        return None
    pattern = str(logits / logit_layout.shard_glob(key))
    n = len(shards)
    pattern = pattern.replace("-of-*", f"-of-{n}")
    what = f"--workdir shards {pattern!r}"
    return Split(key, name, None, what, tuple(str(p) for p in shards), pattern)


def workdir_splits(workdir: epath.Path, text: str) -> list[Split]:
    """Val, test and every shifted test set a training run exported."""
    if not workdir.exists():
        raise UserError(f"--workdir {text!r} does not exist.")
    if not workdir.is_dir():
        raise UserError(f"--workdir {text!r} is a file, not a training run's workdir.")
    logits = workdir / "logits"
    found = {key: _exported(logits, key) for key in ("val", "test")}
    missing = [f"{key}.npz" for key, split in found.items() if split is None]
    if missing:
        names = " and ".join(f"logits/{n}" for n in missing)
        if missing == ["val.npz"]:
            raise UserError(
                f"--workdir {text!r} has logits/test.npz but no logits/val.npz to "
                "fit on: its run had no validation split (config.dataset."
                "val_split); give --val and --test instead."
            )
        checkpoints = workdir / "checkpoints"
        if checkpoints.is_dir() and any(
            "tmp" not in p.name for p in checkpoints.iterdir()
        ):
            raise UserError(
                f"--workdir {text!r} has checkpoints but no {names}: the run has "
                "not finished (it exports its logits at the end); rerun its train "
                "command to finish it."
            )
        if checkpoints.exists() or (workdir / "config.json").exists():
            empty = " (its checkpoints/ is empty)" if checkpoints.exists() else ""
            raise UserError(
                f"--workdir {text!r} has no {names} and no checkpoint{empty}: the "
                "run stopped before its first "
                "checkpoint (it diverged, failed or was stopped; the train "
                "command's last line said which). Fix the cause (a diverged run "
                "needs e.g. a lower learning rate) and rerun the train command, "
                "which starts again from step 0."
            )
        raise UserError(
            f"--workdir {text!r} has no {names}, checkpoints or config.json: it is "
            "not the workdir of a `python -m calib_jax.train` run."
        )
    splits = [found["val"], found["test"]]
    for corruption, severity in logit_layout.exported_shifts(logits):
        split = _exported(logits, f"shift/{corruption}/{severity}")
        if split is not None:
            splits.append(split)
    return splits


def load_split(split: Split, logits_key: str, labels_key: str):
    """``(logits float [N, K], labels int [N])`` of a split's ``.npz`` (NumPy)."""
    what, path = split.what, split.path
    if path.is_dir():
        raise UserError(f"{what} is not a file.")
    try:
        raw = io.BytesIO(path.read_bytes())
    except OSError as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot read {what}: {msg}") from None
    if not zipfile.is_zipfile(raw):  # .npy, text, truncated or random bytes
        raise UserError(f"{what} is not an .npz archive (np.savez output).")
    try:
        with np.load(raw, allow_pickle=False) as data:
            keys = list(data.keys())
            for key in (logits_key, labels_key):
                if key not in keys:
                    raise UserError(
                        f"{what} has no array {key!r} "
                        f"(it has: {', '.join(keys) or 'nothing'})."
                    )
            logits = np.asarray(data[logits_key])
            labels = np.asarray(data[labels_key])
    except UserError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot read {what} as .npz: {msg}") from None
    if labels.dtype.kind == "f" and labels.size and np.all(labels == np.round(labels)):
        labels = labels.astype(np.int64)  # integral floats are accepted as ids
    if logits.dtype.kind in "iub":
        logits = logits.astype(np.float32)
    for key, arr, kinds in ((logits_key, logits, "f"), (labels_key, labels, "iu")):
        if arr.dtype.kind not in kinds:
            kind = "floating point" if kinds == "f" else "integer class ids"
            raise UserError(
                f"{what}: array {key!r} must be {kind}, got dtype {arr.dtype}."
            )
    return logits, labels


def check_sizes(splits, methods, num_bins: int, logits_key: str) -> None:
    """UserError when the bins or a method's parameters cannot fit in memory."""
    first = next((s for s in splits if s.shards is None), None)
    if first is None:
        shape = (None, shard_source(splits[0]).num_classes)
    else:
        shape = logits_shape(first, logits_key)
    if shape is None or len(shape) != 2:
        return  # load_split names what is wrong with the file
    k = shape[1]
    try:
        _memory.check_fits(
            _BIN_BYTES * k * num_bins,
            f"--num_bins={num_bins} at K = {k} classes (the metrics' bins "
            "of every class)",
            fix="lower --num_bins (15 is usual)",
        )
        for name in methods:
            if name in _SQUARE:
                _matrix.check_square_fit(k, np.float32, f"--method {name}")
    except ValueError as err:
        raise UserError(str(err)) from None


def output_dir(value: str | None, workdir: epath.Path | None, test: Split):
    """``--out``, else ``<workdir>/posthoc`` or ``<test stem>_posthoc``."""
    if value is not None:
        out = as_path(value, "--out")
        if out.suffix in (".json", ".md", ".txt", ".npz") and not out.is_dir():
            raise UserError(
                f"--out names the output directory (it gets {TABLE}, {RESULTS}, "
                f"{CALIBRATED}/ and {CALIBRATORS}/), got {value!r}, a file name."
            )
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {value!r} is a file, not a directory.")
        return out
    if workdir is not None:
        return workdir / "posthoc"
    if test.path is None:
        raise UserError(
            f"{test.what}: give --out (the default <test stem>_posthoc/ is "
            "named after one --test file)."
        )
    return test.path.with_name(f"{test.path.stem}_posthoc")


def outputs(out: epath.Path, methods) -> list[epath.Path]:
    """Every output path (files, and one directory per method) of a run."""
    paths = [out / TABLE, out / RESULTS]
    for method in methods:
        name = file_name(method)
        paths += [out / CALIBRATORS / f"{name}.npz", out / CALIBRATED / name]
    return paths


def first_existing(paths) -> epath.Path | None:
    """The first path that exists (a directory: with more than temporary files)."""
    for path in paths:
        if not path.exists():
            continue
        if not path.is_dir() or any(
            not storage.is_temporary(p.name) for p in path.iterdir()
        ):
            return path
    return None


def check_writable(out: epath.Path, value: str | None) -> None:
    """A UserError, before any work, when ``out`` cannot be written."""
    what = "--out" if value is not None else "the output directory"
    try:
        storage.check_writable(out, what=what)
    except ValueError as err:
        raise UserError(str(err)) from None


def logits_shape(split: Split, key: str) -> tuple[int, ...] | None:
    """The shape of array ``key`` from the split's ``.npz`` header, or None."""
    try:
        with (
            split.path.open("rb") as f,
            zipfile.ZipFile(f) as archive,
            archive.open(f"{key}.npy") as member,
        ):
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                header = np.lib.format.read_array_header_2_0(member)
            else:
                return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, zlib.error, EOFError):
        return None
    return tuple(int(n) for n in header[0])


def refuse(path) -> UserError:
    """The error for an output that exists without ``--overwrite``."""
    return UserError(f"output {str(path)!r} exists; pass --overwrite to replace it.")


class Outputs:
    """Writes a run's outputs whole and removes the ones it created on failure."""

    def __init__(self, *, overwrite: bool):
        self.overwrite = overwrite
        self.created: list[epath.Path] = []

    def _write(self, path: epath.Path, write) -> None:
        new = not self.overwrite or not path.exists()
        try:
            storage.write_file(path, write, exclusive=not self.overwrite)
        except FileExistsError:
            raise refuse(path) from None
        except OSError as err:
            raise StorageError(
                f"cannot write {str(path)!r}: {storage.os_error_text(err)}."
            ) from None
        if new:
            self.created.append(path)

    def npz(self, path: epath.Path, **arrays) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = buf.getvalue()
        self._write(path, lambda target: target.write_bytes(data))

    def text(self, path: epath.Path, text: str) -> None:
        data = text.encode("utf-8")
        self._write(path, lambda target: target.write_bytes(data))

    def calibrator(self, path: epath.Path, cal) -> None:
        """Writes a fitted calibrator (:meth:`Calibrator.save`)."""
        self._write(path, lambda target: cal.save(target, overwrite=True))

    def remove_created(self) -> None:
        """Removes every output this run created (after a failure)."""
        for path in reversed(self.created):
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
        self.created = []
