"""TensorBoard events of a benchmark (``--config.log.tensorboard=True``).

Under ``<workdir>/tensorboard``: one run per cell (``<method>/seed<k>``)
with, for every calibrator, the ECE, accuracy and NLL of every evaluation set
(``<calibrator>/<shift>/<metric>``, clean = ``test``) and the ECE against
severity as a curve (``<calibrator>/ece_vs_severity``, step = severity, 0 =
clean, each point the mean over the corruptions); and one run ``report`` with
every figure of ``report.md`` as an image. Each cell's training run writes its
own events (losses per step, per-shift metrics, the reliability diagram)
under ``cells/<method>/seed<k>/train/tensorboard``.
"""

from __future__ import annotations

import io
from collections import defaultdict

import numpy as np
from etils import epath

from calib_jax import tensorboard

# The metrics of each row written as scalars.
SCALARS = ("ece", "accuracy", "nll")


def root(workdir: epath.Path) -> epath.Path:
    """The benchmark's TensorBoard directory."""
    return workdir / tensorboard.DIRNAME


def write_cell(workdir: epath.Path, method: str, seed: int, rows) -> None:
    """Writes the scalars of one finished cell (its result rows)."""
    curves = defaultdict(lambda: defaultdict(list))
    with tensorboard.Writer(root(workdir) / method / f"seed{seed}") as tb:
        for row in rows:
            cal = row["calibrator"]
            shift = "test" if row["shift"] == "clean" else row["shift"]
            tb.scalars(0, {f"{cal}/{shift}/{m}": row[m] for m in SCALARS if m in row})
            curves[cal][int(row["severity"])].append(row["ece"])
        for cal, by_severity in curves.items():
            for severity, values in sorted(by_severity.items()):
                tb.scalars(severity, {f"{cal}/ece_vs_severity": np.mean(values)})


def write_figures(workdir: epath.Path, names) -> None:
    """Writes the report's PNG figures ``names`` (under ``workdir``) as images."""
    from matplotlib import image as mpimg

    with tensorboard.Writer(root(workdir) / "report") as tb:
        for name in names:
            pixels = mpimg.imread(io.BytesIO((workdir / name).read_bytes()), "png")
            rgb = np.round(255 * np.asarray(pixels)[..., :3]).astype(np.uint8)
            tb.add_image(name.removesuffix(".png"), 0, rgb)
