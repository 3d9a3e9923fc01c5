"""OOD scores and bootstrap intervals of the benchmark rows (their report tables:
test_tables.py).

The value tests compile every benchmark metric, conformal fit, bootstrap and
OOD score for their own shapes (about 20 s on a shared 2-core machine): they
are ``slow``. ``tests/benchmark/test_benchmark.py`` checks the fields and
tables of a real tiny grid in the fast suite.
"""

import _reference_metrics as ref
import jax
import numpy as np
import pytest

from calib_jax import metrics, posthoc
from calib_jax.benchmark import evaluate


def _logits(seed, n=300, k=5, signal=3.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n).astype(np.int32)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += rng.uniform(0, signal, n)
    return (2.5 * z).astype(np.float32), y


LOGITS = {
    "val": _logits(0),
    "test": _logits(1),
    "noise/1": _logits(2),
    "ood": (_logits(3, n=200, signal=0.0)[0], np.full(200, -1, np.int32)),
}
KW = {"bootstrap_samples": 64, "confidence": 0.9}


def _cell(seed, logits=LOGITS, **kw):
    return evaluate.cell_rows(
        logits, method="ce", seed=seed, calibrators=("none", "ts:nll"), **kw
    )


@pytest.fixture(scope="module")
def cells():
    return LOGITS, _cell(0, **KW) + _cell(1, **KW)


def _msp(z):
    p = np.exp(z - z.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).max(1)


@pytest.mark.slow
def test_clean_rows_carry_ood_scores_of_the_calibrated_logits(cells):
    logits, rows = cells
    ts = posthoc.fit("ts:nll", *logits["val"])
    clean = [r for r in rows if r["shift"] == "clean"]
    assert len(clean) == 4
    for r in clean:
        apply = ts.apply if r["calibrator"] == "ts:nll" else (lambda z: z)
        s_in = _msp(np.asarray(apply(logits["test"][0]), np.float64))
        s_out = _msp(np.asarray(apply(logits["ood"][0]), np.float64))
        assert r["ood_auroc"] == pytest.approx(ref.ood_auroc(s_in, s_out), abs=1e-5)
        assert r["ood_aupr_in"] == pytest.approx(ref.ood_aupr(s_in, s_out), abs=1e-5)
        assert r["ood_aupr_out"] == pytest.approx(
            ref.ood_aupr(s_in, s_out, "out"), abs=1e-5
        )
        assert r["ood_fpr_at_95_tpr"] == pytest.approx(
            ref.fpr_at_tpr(s_in, s_out), abs=1e-6
        )
    # Only clean rows, and the other fields are those of a run without OOD.
    assert not any("ood_auroc" in r for r in rows if r["shift"] != "clean")
    without = {k: v for k, v in logits.items() if k != "ood"}
    plain = _cell(0, without)

    def added(k):  # the OOD and bootstrap fields (corp_log_* are neither)
        return k.startswith("ood_") or k.endswith(("_lo", "_hi"))

    strip = [{k: v for k, v in r.items() if not added(k)} for r in rows]
    assert strip[: len(plain)] == plain


@pytest.mark.slow
def test_bootstrap_intervals_are_percentiles_of_shared_resamples(cells):
    logits, rows = cells
    clean = {(r["calibrator"], r["seed"]): r for r in rows if r["shift"] == "clean"}
    z, y = logits["test"]
    # Accuracy by hand over the cell's resamples (metrics.resample_indices).
    key = evaluate.bootstrap_key("ce", 0)
    n = len(y)
    correct = (np.argmax(z, 1) == y).astype(np.float64)
    values = [
        correct[np.asarray(metrics.resample_indices(key, b, n, n))].mean()
        for b in range(64)
    ]
    lo, hi = np.quantile(values, [0.05, 0.95])
    row = clean["none", 0]
    assert row["accuracy_lo"] == pytest.approx(lo, abs=1e-6)
    assert row["accuracy_hi"] == pytest.approx(hi, abs=1e-6)
    assert row["accuracy_lo"] <= row["accuracy"] <= row["accuracy_hi"]
    for m in evaluate.BOOTSTRAP_METRICS:
        assert row[f"{m}_lo"] <= row[f"{m}_hi"]
    # Temperature scaling keeps every prediction: on the same resamples the
    # accuracy intervals are identical, while the NLL intervals differ.
    ts = clean["ts:nll", 0]
    assert (ts["accuracy_lo"], ts["accuracy_hi"]) == (
        row["accuracy_lo"],
        row["accuracy_hi"],
    )
    assert ts["nll_hi"] != row["nll_hi"]
    # Another seed of the cell draws other resamples; a rerun the same ones.
    assert clean["none", 1]["ece_lo"] != row["ece_lo"]
    assert _cell(0, **KW) == rows[: len(rows) // 2]
    # The ECE interval equals metrics.bootstrap's with the same key.
    probs = jax.nn.softmax(z, axis=-1)
    res = metrics.bootstrap(
        {"ece": metrics.ece}, probs, y, num_samples=64, key=key, confidence=0.9
    )
    assert row["ece_lo"] == float(res.lower["ece"])
