"""The reliability rows of a cell's evaluation: the data of the report's diagrams."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from calib_jax import metrics, posthoc
from calib_jax.benchmark import evaluate


def _logits(seed, n=240, k=5):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n).astype(np.int32)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += rng.uniform(0, 3, n)
    return (2.5 * z).astype(np.float32), y


@pytest.mark.long
def test_stacked_reliability_is_the_bins_of_each_set():
    sets = [_logits(s, n=120, k=4) for s in (5, 6, 7)]
    z = np.stack([a for a, _ in sets])
    y = np.stack([b for _, b in sets])
    got = evaluate.stacked_reliability(z, y, num_bins=9)
    for i, (zi, yi) in enumerate(sets):
        want = metrics.reliability_bins(jax.nn.softmax(zi, axis=-1), yi, num_bins=9)
        np.testing.assert_array_equal(got["count"][i], want["count"])
        for k in ("confidence", "accuracy", "lower", "upper"):
            np.testing.assert_allclose(got[k][i], want[k], rtol=1e-6, atol=0)


@pytest.mark.long
def test_reliability_rows_hold_the_bins_of_every_calibrated_set():
    logits = {"val": _logits(0), "test": _logits(1), "noise/2": _logits(2)}
    rows, reliability = evaluate.cell_results(
        logits, method="ce", seed=4, calibrators=("none", "ts:nll"), num_bins=12
    )
    assert (
        evaluate.cell_rows(
            logits, method="ce", seed=4, calibrators=("none", "ts:nll"), num_bins=12
        )
        == rows
    )
    assert len(reliability) == len(rows) == 4
    ts = posthoc.fit("ts:nll", *logits["val"])
    keys = ("method", "calibrator", "seed", "shift", "corruption", "severity")
    for row, rel in zip(rows, reliability):
        assert {k: rel[k] for k in keys} == {k: row[k] for k in keys}
        assert set(rel) == {*keys, *evaluate.RELIABILITY_BINS, "ece"}
        assert rel["ece"] == row["ece"]
        z, y = logits["test" if row["shift"] == "clean" else row["shift"]]
        if row["calibrator"] == "ts:nll":
            z = np.asarray(ts.apply(z))
        probs = jax.nn.softmax(z, axis=-1)
        want = metrics.reliability_bins(probs, y, num_bins=12)
        assert rel["count"] == np.asarray(want["count"]).tolist()
        assert sum(rel["count"]) == len(y)
        for k in ("confidence", "accuracy", "lower", "upper"):
            assert len(rel[k]) == 12
            np.testing.assert_allclose(rel[k], np.asarray(want[k]), rtol=1e-6, atol=0)
        np.testing.assert_allclose(
            rel["ece"], float(metrics.ece(probs, y, num_bins=12)), rtol=1e-6
        )
