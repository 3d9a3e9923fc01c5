"""64-bit mode (``JAX_ENABLE_X64=1``): every post-hoc method fits float32
logits as in the default mode, and bad inputs raise the same ValueError.

One subprocess (the mode is fixed when JAX starts) fits every method and
prints the calibrated probabilities; the test compares them with fits in
this process (32-bit mode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from calib_jax import posthoc

ROOT = Path(__file__).resolve().parents[2]

# The inputs and the fits, run here and in the subprocess alike.
SETUP = """
import numpy as np
rng = np.random.default_rng(0)
y = rng.integers(0, 3, 64)
z = rng.standard_normal((64, 3)).astype(np.float32)
z[np.arange(64), y] += 2.0
yb = rng.integers(0, 2, 64)
zb = rng.standard_normal((64, 2)).astype(np.float32)
zb[np.arange(64), yb] += 1.0
NAMES = ["ts:nll", "ts:sb_ece", "ts:hb_ece", "ts:ece_grid", "ets", "pts", "cts",
         "vector", "matrix", "dirichlet", "histogram_binning", "isotonic", "platt",
         "beta", "ts+classwise", "ets+classwise", "pts+classwise", "cts+classwise"]
def data(name):
    return (zb, yb) if name in ("platt", "beta") else (z, y)
"""

CHILD = """
import json, warnings
import jax
from calib_jax import conformal, metrics, posthoc
warnings.simplefilter("ignore")
out = {"x64": bool(jax.config.jax_enable_x64), "probs": {}, "errors": {}}
for name in NAMES:
    x, lab = data(name)
    out["probs"][name] = np.asarray(posthoc.fit(name, x, lab).probs(x)).tolist()
out["fit_temperature"] = float(posthoc.fit_temperature(z, y))
bad_z = z.copy()
bad_z[4, 1] = np.nan
bad_y = y.astype(np.int64)
bad_y[6] = 2**40
calls = {
    "ts nan": lambda: posthoc.fit("ts", bad_z, y),
    "ets nan": lambda: posthoc.fit("ets", bad_z, y),
    "ts label": lambda: posthoc.fit("ts", z, bad_y),
    "fit_temperature label": lambda: posthoc.fit_temperature(z, bad_y),
    "ece label": lambda: metrics.ece(np.asarray(jax.nn.softmax(z)), bad_y),
    "conformal label": lambda: conformal.fit("thr", z, bad_y, alpha=0.2),
    "coverage label": lambda: conformal.coverage(z > 0, bad_y),
}
for what, call in calls.items():
    try:
        call()
        out["errors"][what] = "no error"
    except Exception as err:
        out["errors"][what] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


# Fits and compiles 18 methods twice (about 3 minutes of make test at load 4):
# make test-slow runs it.
@pytest.mark.long
def test_every_method_fits_in_x64_as_in_x32():
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(CHILD)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["x64"] and not jax.config.jax_enable_x64

    scope: dict = {}
    exec(SETUP, scope)  # noqa: S102 - the same inputs as the subprocess
    for name in scope["NAMES"]:
        x, lab = scope["data"](name)
        ref = np.asarray(posthoc.fit(name, x, lab).probs(x))
        got = np.asarray(child["probs"][name])
        assert got.shape == ref.shape and np.isfinite(got).all(), name
        # PTS trains a small network with Adam for many steps: float32
        # round-off differs between the modes and accumulates.
        atol = 5e-2 if name.startswith("pts") else 1e-4
        np.testing.assert_allclose(got, ref, atol=atol, err_msg=name)
    t = float(posthoc.fit_temperature(scope["z"], scope["y"]))
    np.testing.assert_allclose(child["fit_temperature"], t, rtol=1e-5)

    errors = child["errors"]
    for what in ("ts nan", "ets nan"):
        assert errors[what] == (
            "ValueError: logits contains NaN or inf in 1 row(s) (first: row 4)."
        ), what
    for what in ("ts label", "fit_temperature label", "conformal label"):
        assert errors[what].startswith(
            f"ValueError: labels must lie in [0, K) = [0, 3); found {2**40} at row 6"
        ), (what, errors[what])
    assert errors["ece label"].startswith(
        f"ValueError: labels must lie in [0, K) = [0, 3); found {2**40} at row 6"
    )
    assert errors["coverage label"].startswith(
        f"ValueError: labels must lie in [0, K) = [0, 3); found {2**40} at row 6"
    )
