"""``experiments/update_expected.py`` writes this machine's recording (the
quick run's rows, claims and machine) and the demo's kept rows."""

from __future__ import annotations

import importlib.util
import json

from etils import epath

from calib_jax import storage
from calib_jax.benchmark import paper_claims, reproducibility, runner

ROOT = epath.Path(__file__).resolve().parent.parent.parent
QUICK = ROOT / "tests" / "benchmark" / "expected" / "quick"


def _script():
    spec = importlib.util.spec_from_file_location(
        "update_expected", ROOT / "experiments" / "update_expected.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_quick_adds_this_machines_recording_and_keeps_the_others(tmp_path):
    script = _script()
    script.EXPECTED = epath.Path(tmp_path)
    other = tmp_path / "quick" / "000000000000-jaxlib-0.0.1"
    other.mkdir(parents=True)
    (other / "machine.json").write_text("{}\n")
    (recording, *_) = reproducibility.recordings(QUICK)
    results = QUICK / recording / runner.RESULTS_FILE
    script.write_quick(results)
    here = reproducibility.machine()
    out = tmp_path / "quick" / reproducibility.recording_name(here)
    assert (out / runner.RESULTS_FILE).read_bytes() == results.read_bytes()
    assert json.loads((out / "machine.json").read_text()) == here
    claims = json.loads((out / "claims.json").read_text())
    assert claims == paper_claims.claims(storage.read_jsonl(results))
    assert (other / "machine.json").read_text() == "{}\n"
    assert reproducibility.recording_of(epath.Path(tmp_path / "quick")) == out.name
