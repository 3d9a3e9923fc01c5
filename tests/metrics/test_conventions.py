"""Bin assignment of every preset on confidences exactly on the edges."""

from __future__ import annotations

import _reference_metrics as ref
import jax
import numpy as np
import pytest

from calib_jax import metrics
from calib_jax.metrics import _conventions

PRESETS = sorted(ref.PRESET_RULES)


def _edge_values(m):
    """0, every float32 k/m, the float32 neighbours of each, and 1.0.

    Next to 0 the smallest *normal* float32 stands in for the neighbour: XLA
    on CPU flushes subnormals to zero, so a subnormal probability acts as 0.
    """
    e = np.float32(np.arange(m + 1) / m)
    up = np.nextafter(e[1:-1], np.float32(2))
    down = np.nextafter(e[1:], np.float32(-1))
    tiny = np.float32([np.finfo(np.float32).tiny])
    values = np.concatenate([e, up, down, tiny])
    return np.unique(values).astype(np.float32)


@pytest.mark.long
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("num_bins", [5, 10, 15, 22, 60])
def test_bin_index_matches_rule_on_edges(preset, num_bins):
    values = _edge_values(num_bins)
    conv = metrics.get_convention(preset)
    got = jax.jit(_conventions.bin_index, static_argnums=(1, 2))(values, num_bins, conv)
    for c, b in zip(values, np.asarray(got)):
        expected = ref.bin_of(float(c), num_bins, preset)
        assert (b if b >= 0 else None) == expected, (preset, num_bins, float(c), b)


@pytest.mark.parametrize("preset", PRESETS)
def test_from_confidences_on_edges_0_to_1(preset):
    # Binary-style confidences exactly on 0, 0.2, ..., 1.0 (5 bins).
    conf = np.float32([0.0, 0.0, 0.2, 0.2, 0.4, 0.6, 0.6, 0.8, 1.0, 1.0, 1.0])
    correct = np.array([0, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0], bool)
    stats = metrics.BinnedStats.from_confidences(
        conf, correct, num_bins=5, convention=preset
    )
    for p in (1, 2, float("inf")):
        expected = ref.ece_from_confidences(
            conf, correct, m=5, p="inf" if p == float("inf") else p, preset=preset
        )
        np.testing.assert_allclose(float(stats.compute(p)), expected, rtol=1e-6)
    assert int(stats.total) == len(conf)


def test_default_places_zero_first_and_one_last():
    got = _conventions.bin_index(np.float32([0.0, 1.0]), 15, metrics.get_convention())
    assert np.asarray(got).tolist() == [0, 14]


def test_plain_floor_would_misplace_an_edge():
    # The reason for comparing against edges: floor(c * 22) puts float32(13/22)
    # in bin 12 although it equals edge 13.
    c = np.float32(13 / 22)
    assert int(np.floor(c * np.float32(22))) == 12
    assert int(_conventions.bin_index(c, 22, metrics.get_convention())) == 13


def test_netcal_edges_are_float64_linspace():
    e = _conventions.edges(metrics.get_convention("netcal"), 10)
    e64 = np.linspace(0, 1, 11)
    for k in range(11):
        # Smallest float32 not below the float64 edge.
        assert float(e[k]) >= e64[k]
        assert float(np.nextafter(e[k], np.float32(-1))) < e64[k]


def test_unknown_preset_and_bad_convention():
    with pytest.raises(ValueError, match="known presets"):
        metrics.get_convention("sklearn")
    with pytest.raises(ValueError, match="side"):
        metrics.Convention(name="x", side="middle")
    with pytest.raises(ValueError, match="min_count"):
        metrics.Convention(name="x", min_count=0)
