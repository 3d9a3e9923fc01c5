"""Scores, tables and JSON of ``python -m calib_jax.posthoc`` (see :mod:`._cli`)."""

from __future__ import annotations

import numpy as np

from calib_jax import metrics as metrics_lib
from calib_jax.posthoc import _pts

# (results.json key, table column): the trainer's metrics of every split.
COLUMNS = tuple(
    (k, metrics_lib.SUMMARY_METRICS[k].column) for k in metrics_lib.SPLIT_METRICS
)


def metrics(probs, labels, num_bins) -> dict[str, float]:
    """The trainer's end-of-run metrics of ``probs [N, K]``."""
    values = metrics_lib.summary(
        probs, labels, num_bins=num_bins, names=metrics_lib.SPLIT_METRICS
    )
    return {k: float(v) for k, v in values.items()}


def metrics_of_chunks(source, apply, num_bins) -> dict[str, float]:
    """:func:`metrics` of sharded logits calibrated by ``apply`` (or None)."""
    pairs = (
        (chunk.x if apply is None else np.asarray(apply(chunk.x)), chunk.labels)
        for chunk in source
    )
    values = metrics_lib.summary_of_chunks(
        pairs,
        from_logits=True,
        num_bins=num_bins,
        names=metrics_lib.SPLIT_METRICS,
        chunk_rows=source.chunk_rows,
        progress_bar=False,
    )
    return {k: float(v) for k, v in values.items()}


def params_summary(cal, test_logits) -> dict:
    """JSON summary of a calibrator's parameters (PTS: its test temperatures)."""
    if cal.name.startswith("pts"):
        t = np.asarray(_pts.sample_temperatures(cal.params, test_logits))
        out = {
            "test_T_mean": float(t.mean()),
            "test_T_min": float(t.min()),
            "test_T_max": float(t.max()),
        }
        out.update(cal.replace(params={}).summary())
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


def _markdown(header, rows, numeric) -> str:
    """A Markdown table padded to fixed width (readable as plain text too)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        padded = (
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        )
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if i in numeric else "-" * (w + 2)
        for i, w in enumerate(widths)
    )
    return "\n".join([line(header), rule + "|", *map(line, rows)])


def tables(rows, test_name: str, shift_keys) -> str:
    """The printed tables: test metrics per method and, with shifts, their mean."""
    numeric = set(range(1, len(COLUMNS) + 2))
    header = ["method", *(c for _, c in COLUMNS), "fit_s", "params"]
    body = []
    for r in rows:
        fit = r["fit"]
        body.append(
            [r["method"]]
            + [f"{r['test'][k]:.4f}" for k, _ in COLUMNS]
            + [f"{fit['seconds']:.2f}" if fit else "-"]
            + [_short(fit["params"]) if fit else ""]
        )
    text = f"## test: {test_name}\n\n" + _markdown(header, body, numeric)
    if shift_keys:
        header = ["method", *(c for _, c in COLUMNS)]
        body = [
            [r["method"]] + [f"{r['shift_mean'][k]:.4f}" for k, _ in COLUMNS]
            for r in rows
        ]
        text += (
            f"\n\n## shifted test: mean over {len(shift_keys)} set(s)\n\n"
            + _markdown(header, body, set(range(1, len(COLUMNS) + 1)))
        )
    return text + "\n"


def jsonable(x):
    """``x`` with NumPy arrays and scalars turned into Python lists and numbers."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x
