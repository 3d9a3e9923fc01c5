"""``python -m calib_jax.posthoc``: fit post-hoc calibrators on validation
logits, evaluate them on test logits, print a table and write JSON.

Example::

    python -m calib_jax.posthoc --val val.npz --test test.npz \\
        --method ts:nll --method ts:sb_ece --method cts --method ts:nll+classwise

Each ``.npz`` holds ``logits`` ``[N, K]`` and ``labels`` ``[N]`` (other key
names via ``--logits-key``/``--labels-key``). The JSON goes to ``--out``
(default: ``<test stem>_posthoc.json`` beside the test file) and is never
overwritten unless ``--overwrite`` is given. Every path may be local or a
``gs://`` URL. User errors (bad files, keys, values, method names, a malformed
URL or an unreachable bucket) print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import zipfile
import zlib

import numpy as np
from etils import epath

from calib_jax import storage

PROG = "python -m calib_jax.posthoc"
EXIT_USAGE = 2


class UserError(Exception):
    """An error in the command line or the input files (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Fit post-hoc calibrators on validation logits and evaluate "
        "them on test logits.",
    )
    p.add_argument("--val", required=True, help="validation .npz (fit set)")
    p.add_argument("--test", required=True, help="test .npz (evaluation set)")
    p.add_argument(
        "--method",
        action="append",
        required=True,
        help="calibrator name, repeatable: ts, ts:nll, ts:sb_ece, ts:hb_ece, "
        "ts:ece_grid, ets, pts, cts, vector, matrix, dirichlet, and "
        "<ts|ts:nll|ets|pts|cts>+classwise",
    )
    p.add_argument(
        "--objective",
        default=None,
        help="objective for a bare 'ts' method (default nll)",
    )
    p.add_argument("--out", default=None, help="JSON output path")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out file"
    )
    p.add_argument("--seed", type=int, default=0, help="initialisation seed (PTS)")
    p.add_argument(
        "--num-bins", type=int, default=15, help="bins of the ECE metrics (15)"
    )
    p.add_argument("--logits-key", default="logits")
    p.add_argument("--labels-key", default="labels")
    return p


def _as_path(value: str, what: str) -> epath.Path:
    """Parses a path argument; a malformed URL or unreachable bucket is a UserError."""
    try:
        path = storage.as_path(value, what=what)
        storage.check_reachable(path, what=what)
    except ValueError as err:
        raise UserError(str(err)) from None
    return path


def _load(path: str, which: str, logits_key: str, labels_key: str):
    file = _as_path(path, f"--{which}")
    if not file.exists():
        raise UserError(f"--{which} file {path!r} does not exist.")
    if file.is_dir():
        raise UserError(f"--{which} path {path!r} is not a file.")
    try:
        raw = io.BytesIO(file.read_bytes())
    except OSError as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot read --{which} file {path!r}: {msg}") from None
    if not zipfile.is_zipfile(raw):  # .npy, text, truncated or random bytes
        raise UserError(
            f"--{which} file {path!r} is not an .npz archive (np.savez output)."
        )
    try:
        with np.load(raw, allow_pickle=False) as data:
            keys = list(data.keys())
            for key in (logits_key, labels_key):
                if key not in keys:
                    raise UserError(
                        f"--{which} file {path!r} has no array {key!r} "
                        f"(it has: {', '.join(keys) or 'nothing'})."
                    )
            logits = np.asarray(data[logits_key])
            labels = np.asarray(data[labels_key])
    except UserError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot read --{which} file {path!r} as .npz: {msg}") from None
    if labels.dtype.kind == "f" and labels.size and np.all(labels == np.round(labels)):
        labels = labels.astype(np.int64)  # integral floats are accepted as ids
    if logits.dtype.kind in "iub":
        logits = logits.astype(np.float32)
    for key, arr, kinds in ((logits_key, logits, "f"), (labels_key, labels, "iu")):
        if arr.dtype.kind not in kinds:
            what = "floating point" if kinds == "f" else "integer class ids"
            raise UserError(
                f"--{which} array {key!r} must be {what}, got dtype {arr.dtype}."
            )
    return logits, labels


def _resolve_methods(methods, objective):
    from calib_jax.posthoc import get_calibrator

    resolved = []
    for name in methods:
        if objective is not None and (name == "ts" or name == "ts+classwise"):
            name = name.replace("ts", f"ts:{objective}", 1)
        try:
            get_calibrator(name)
        except ValueError as err:
            raise UserError(str(err)) from None
        resolved.append(name)
    return resolved


def _default_out(test_path: str) -> epath.Path:
    test = _as_path(test_path, "--test")
    return test.with_name(f"{test.stem}_posthoc.json")


def _metrics(probs, labels, num_bins):
    from calib_jax import metrics

    return {
        "accuracy": float(metrics.accuracy(probs, labels)),
        "nll": float(metrics.nll(probs, labels)),
        "ece": float(metrics.ece(probs, labels, num_bins=num_bins)),
        "adaptive_ece": float(metrics.adaptive_ece(probs, labels, num_bins=num_bins)),
        "classwise_ece": float(metrics.classwise_ece(probs, labels, num_bins=num_bins)),
        "brier": float(metrics.brier(probs, labels)),
    }


def _params_summary(cal, test_logits) -> dict:
    if cal is None:
        return {}
    if cal.name.startswith("pts"):
        from calib_jax.posthoc._pts import sample_temperatures

        t = np.asarray(sample_temperatures(cal.params, test_logits))
        out = {
            "test_T_mean": float(t.mean()),
            "test_T_min": float(t.min()),
            "test_T_max": float(t.max()),
        }
        aux = cal.replace(params={}).summary()
        out.update(aux)
        return out
    return cal.summary()


def _short(summary: dict, width: int = 48) -> str:
    parts = []
    for key, value in summary.items():
        if key in ("class_losses",):
            continue
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        elif isinstance(value, list):
            parts.append(f"{key}=[{', '.join(f'{v:.3g}' for v in value)}]")
        elif isinstance(value, dict):
            parts.append(
                f"{key}~{value['mean']:.3g}[{value['min']:.3g},{value['max']:.3g}]"
            )
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows) -> str:
    cols = ["method", "acc", "nll", "ece", "ada_ece", "cw_ece", "brier", "fit_s"]
    keys = ["accuracy", "nll", "ece", "adaptive_ece", "classwise_ece", "brier"]
    lines = []
    name_w = max(len("method"), *(len(r["method"]) for r in rows))
    header = f"{cols[0]:<{name_w}}" + "".join(f"{c:>9}" for c in cols[1:])
    lines.append(header + "  params")
    lines.append("-" * (len(header) + 8))
    for r in rows:
        line = f"{r['method']:<{name_w}}" + "".join(f"{r[k]:>9.4f}" for k in keys)
        line += (
            f"{r['fit_seconds']:>9.2f}" if r["fit_seconds"] is not None else f"{'-':>9}"
        )
        lines.append(line + "  " + _short(r["params"]))
    return "\n".join(lines)


def run(argv=None) -> int:
    """Runs the CLI; raises :class:`UserError` for user errors."""
    args = build_parser().parse_args(argv)
    if args.num_bins < 1:
        raise UserError(f"--num-bins must be >= 1, got {args.num_bins}.")
    methods = _resolve_methods(args.method, args.objective)
    out = _as_path(args.out, "--out") if args.out else _default_out(args.test)
    if out.exists() and not args.overwrite:
        raise UserError(
            f"output file {str(out)!r} exists; pass --overwrite to replace it."
        )
    # An object store has no directories: any key under a reachable bucket works.
    if not storage.is_remote(out) and not out.parent.is_dir():
        raise UserError(f"output directory {str(out.parent)!r} does not exist.")

    import jax
    from tqdm import tqdm

    from calib_jax.posthoc import _validate, fit

    val = _load(args.val, "val", args.logits_key, args.labels_key)
    test = _load(args.test, "test", args.logits_key, args.labels_key)
    try:
        val = _validate.check_inputs(*val, name="val logits")[:2]
        test = _validate.check_inputs(*test, name="test logits")[:2]
    except (ValueError, TypeError) as err:
        raise UserError(str(err)) from None
    if val[0].shape[1] != test[0].shape[1]:
        raise UserError(
            f"val logits have K = {val[0].shape[1]} classes but test logits have "
            f"K = {test[0].shape[1]}."
        )
    test_logits, test_labels = test

    rows = [
        {
            "method": "uncalibrated",
            **_metrics(
                jax.nn.softmax(test_logits.astype("float32")),
                test_labels,
                args.num_bins,
            ),
            "fit_seconds": None,
            "params": {},
        }
    ]
    for name in tqdm(
        methods, desc="fitting", unit="method", disable=None, file=sys.stderr
    ):
        kwargs = {"seed": args.seed} if "pts" in name or "classwise" in name else {}
        start = time.perf_counter()
        try:
            cal = fit(name, *val, **kwargs)
            jax.block_until_ready(cal.params)
        except (ValueError, TypeError) as err:
            raise UserError(f"{name}: {err}") from None
        seconds = time.perf_counter() - start
        probs = cal.probs(test_logits)
        rows.append(
            {
                "method": name,
                **_metrics(probs, test_labels, args.num_bins),
                "fit_seconds": seconds,
                "params": _params_summary(cal, test_logits),
            }
        )

    print(_table(rows))
    payload = {
        "val": str(args.val),
        "test": str(args.test),
        "num_bins": args.num_bins,
        "ece": f"top-label, {args.num_bins} equal-width bins, l1",
        "adaptive_ece": f"top-label, {args.num_bins} equal-mass bins, l1",
        "classwise_ece": f"{args.num_bins} equal-width bins, class mean",
        "results": [_jsonable(r) for r in rows],
    }
    text = json.dumps(payload, indent=2) + "\n"
    try:
        storage.write_text(out, text, exclusive=not args.overwrite)
    except FileExistsError:
        raise UserError(
            f"output file {str(out)!r} exists; pass --overwrite to replace it."
        ) from None
    print(f"wrote {out}")
    return 0


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def main(argv=None) -> int:
    """Entry point: returns the exit status (2 for user errors)."""
    try:
        return run(argv)
    except UserError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
