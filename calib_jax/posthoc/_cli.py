"""``python -m calib_jax.posthoc``: fits post-hoc calibrators on validation
logits, scores them on test and shifted test logits, and writes the tables,
JSON, calibrated logits and calibrators. Usage: ``docs/posthoc.md``."""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Sequence

import jax
import numpy as np
from absl import flags

from calib_jax import _cli as entry
from calib_jax import chunks, posthoc, storage
from calib_jax import progress as progress_lib
from calib_jax.posthoc import _binary, _streamed, _validate
from calib_jax.posthoc import _cli_files as files
from calib_jax.posthoc import _cli_flags as cli_flags
from calib_jax.posthoc import _cli_report as report
from calib_jax._cli import UserError

# Seconds between progress lines when stderr is not a terminal.
LOG_INTERVAL = 30.0


def _methods(values, objective) -> list[str]:
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise UserError("give at least one --method (e.g. --method ts:nll,ets).")
    resolved = []
    for name in names:
        if objective is not None and (name == "ts" or name == "ts+classwise"):
            name = name.replace("ts", f"ts:{objective}", 1)
        try:
            posthoc.get_calibrator(name)
        except ValueError as err:
            raise UserError(str(err)) from None
        if name not in resolved:
            resolved.append(name)
    return resolved


def _splits(fv):
    """(workdir or None, splits) from --workdir or --val/--test."""
    if fv.workdir is not None:
        if fv.val is not None or fv.test is not None:
            raise UserError("give --workdir, or --val and --test, not both.")
        workdir = files.as_path(fv.workdir, "--workdir")
        return workdir, files.workdir_splits(workdir, fv.workdir)
    if fv.val is None or fv.test is None:
        if fv.val is None and fv.test is None:
            raise UserError("give --workdir RUN, or --val and --test.")
        raise UserError(f"--{'test' if fv.test is None else 'val'} is required too.")
    return None, files.given_splits(fv.val, fv.test)


def _check_shards(split, methods, fv) -> None:
    """UserError before any work when a sharded split cannot serve the run."""
    refused = [m for m in methods if m not in _streamed.STREAMED]
    if refused:
        raise UserError(
            f"{split.what}: only TS fits stream over shards "
            f"({', '.join(_streamed.STREAMED)}); --method {refused[0]} needs the "
            "logits in memory: give --val and --test as .npz files."
        )
    if (fv.logits_key, fv.labels_key) != ("logits", "labels"):
        raise UserError(
            f"{split.what}: --logits_key/--labels_key apply to .npz files; "
            "shards hold 'logits' and 'labels'."
        )


def _load(splits, fv) -> dict:
    """Every split's checked (logits, labels), or its ``ChunkSource`` if sharded."""
    data = {}
    for split in splits:
        if split.shards is not None:
            data[split.key] = files.shard_source(split)
            continue
        logits, labels = files.load_split(split, fv.logits_key, fv.labels_key)
        try:
            logits, labels, _ = _validate.check_inputs(logits, labels, name="logits")
        except (ValueError, TypeError) as err:
            raise UserError(f"{split.what}: {err}") from None
        data[split.key] = (logits, labels)
    k = _num_classes(data["val"])
    for split in splits[1:]:
        if _num_classes(data[split.key]) != k:
            raise UserError(
                f"{split.what} has K = {_num_classes(data[split.key])} classes "
                f"but the val logits have K = {k}."
            )
    return data


def _num_classes(val) -> int:
    if isinstance(val, chunks.ChunkSource):
        return val.num_classes
    return val[0].shape[1]


def _progress(total: int, first: str):
    """A progress bar over fits and scored splits."""
    tty = progress_lib.is_terminal(sys.stderr)
    return progress_lib.bar(
        total,
        desc=f"fit {first}",
        unit="task",
        interval=LOG_INTERVAL,
        delay=2.0 if tty else LOG_INTERVAL,
    )


def _warn(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(f"warning: {entry.one_line(line)}", file=sys.stderr)


def _warn_below_chance(split, accuracy: float, k: int) -> None:
    if accuracy < 1.0 / k:
        _warn(
            f"{split.what}: accuracy {accuracy:.4f} is below chance (1/K = "
            f"{1.0 / k:.4f}): the labels are probably misaligned with the logits "
            "(rows in another order, or labels of another split)."
        )


def _fit(name, val, seed):
    """Fits one method; its SuspiciousFitWarnings become one stderr line each."""
    kwargs = {"seed": seed} if "pts" in name or "classwise" in name else {}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", posthoc.SuspiciousFitWarning)
        try:
            if isinstance(val, chunks.ChunkSource):
                cal = posthoc.fit_of_chunks(name, val)
            else:
                cal = posthoc.fit(name, *val, **kwargs)
            jax.block_until_ready(cal.params)
        except (ValueError, TypeError) as err:
            raise UserError(f"{name}: {err}") from None
    seconds = time.perf_counter() - start
    notes = []
    for w in caught:
        if issubclass(w.category, posthoc.SuspiciousFitWarning):
            notes.append(entry.one_line(str(w.message)))
            _warn(notes[-1])
        else:  # shown as they would have been
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return cal, seconds, notes


def run(fv: flags.FlagValues) -> int:
    """Runs the command on parsed flags; raises :class:`UserError` for user errors."""
    methods = _methods(fv.method, fv.objective)
    workdir, splits = _splits(fv)
    sharded = [s for s in splits if s.shards is not None]
    if sharded:
        _check_shards(sharded[0], methods, fv)
    out = files.output_dir(fv.out, workdir, splits[1])
    if not fv.overwrite:
        existing = files.first_existing(files.outputs(out, methods))
        if existing is not None:
            raise files.refuse(existing)
    files.check_writable(out, fv.out)
    files.check_sizes(splits, methods, fv.num_bins, fv.logits_key)
    written = files.Outputs(overwrite=fv.overwrite)
    try:
        return _run(fv, methods, workdir, splits, out, written)
    except BaseException:
        written.remove_created()  # a failed run leaves none of its outputs
        raise


def _run(fv, methods, workdir, splits, out, written) -> int:
    data = _load(splits, fv)
    val, test = data["val"], data["test"]
    # A sharded test set stays on disk (only TS runs there: no test logits needed).
    test_logits = None if splits[1].shards is not None else test[0]
    k = _num_classes(val)
    for name in methods:
        if name in posthoc.BINARY_ONLY:
            try:
                _binary.check_binary(name, val[0])
            except ValueError as err:
                raise UserError(str(err)) from None
    if test_logits is not None:
        hits = np.argmax(test_logits, -1) == np.asarray(test[1])
        _warn_below_chance(splits[1], float(np.mean(hits)), k)

    shift_keys = [s.key[len("shift/") :] for s in splits if s.key.startswith("shift/")]
    bar = _progress(len(methods) + (len(methods) + 1) * len(splits), methods[0])
    try:
        bar.set_description("score uncalibrated", refresh=False)
        rows = [_score("uncalibrated", None, splits, data, out, fv, bar, written)]
        if test_logits is None:  # the streamed test metrics hold the accuracy
            _warn_below_chance(splits[1], rows[0]["test"]["accuracy"], k)
        fitted = {}
        for name in methods:
            bar.set_description(f"fit {name}", refresh=False)
            fitted[name] = _fit(name, val, fv.seed)
            bar.update(1)
        for name in methods:
            bar.set_description(f"score {name}", refresh=False)
            rows.append(_score(name, fitted[name], splits, data, out, fv, bar, written))
    finally:
        bar.close()
    for row in rows:
        if shift_keys:
            row["shift_mean"] = {
                key: float(np.mean([row["shift"][s][key] for s in shift_keys]))
                for key, _ in report.COLUMNS
            }
        if row["fit"] is not None:
            cal = fitted[row["method"]][0]
            row["fit"]["params"] = report.params_summary(cal, test_logits)

    table = report.tables(rows, splits[1].source_name, shift_keys)
    print(table, end="")
    payload = {
        "workdir": str(workdir) if workdir is not None else None,
        "inputs": {s.key: s.shards or str(s.path) for s in splits},
        "num_bins": fv.num_bins,
        "metrics": {
            "ece": f"top-label, {fv.num_bins} equal-width bins, l1",
            "adaptive_ece": f"top-label, {fv.num_bins} equal-mass bins, l1",
            "classwise_ece": f"{fv.num_bins} equal-width bins, class mean",
        },
        "results": report.jsonable(rows),
    }
    storage.make_dirs(out)
    written.text(out / files.TABLE, table)
    written.text(out / files.RESULTS, json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def _score(name, fitted, splits, data, out, fv, bar, written) -> dict:
    """Scores and writes one method on every split; returns its results row."""
    row = {"method": name, "fit": None, "calibrator": None}
    cal, calibrated, scores = None, {}, {"shift": {}}
    if fitted is not None:
        cal, seconds, notes = fitted
        fname = files.file_name(name)
        row["fit"] = {"name": cal.name, "seconds": seconds, "warnings": notes}
        row["calibrator"] = f"{files.CALIBRATORS}/{fname}.npz"
        storage.make_dirs(out / files.CALIBRATORS)
        try:
            written.calibrator(out / row["calibrator"], cal)
        except ValueError as err:
            raise UserError(str(err)) from None
        storage.make_dirs(out / files.CALIBRATED / fname)
    for split in splits:
        if split.shards is not None:  # streamed; no calibrated copy of shards
            values = report.metrics_of_chunks(
                data[split.key], None if cal is None else cal.apply, fv.num_bins
            )
        else:
            logits, labels = data[split.key]
            if cal is None:
                z = logits.astype(np.float32)
            else:
                z = cal.apply(logits)
                rel = f"{files.CALIBRATED}/{files.file_name(name)}/{split.file}"
                written.npz(out / rel, logits=np.asarray(z), labels=np.asarray(labels))
                calibrated[split.key] = rel
            values = report.metrics(jax.nn.softmax(z, axis=-1), labels, fv.num_bins)
        if split.key.startswith("shift/"):
            scores["shift"][split.key[len("shift/") :]] = values
        else:
            scores[split.key] = values
        bar.update(1)
    row.update(
        val=scores["val"],
        test=scores["test"],
        shift=scores["shift"],
        shift_mean=None,
        calibrated=calibrated,
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` (default ``sys.argv[1:]``), runs, and returns the exit
    status: 0, 2 (user error), 4 (an output not written) or 130 (Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return entry.run_main(lambda: _main(argv))


def _main(argv: list[str]) -> int:
    try:
        fv = cli_flags.parse_flags(argv)
    except cli_flags.Help as text:
        print(text)
        return 0
    return run(fv)
