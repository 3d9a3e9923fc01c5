"""The platform switch between tuned kernels and plain formulations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import kernels
from calib_jax.metrics import _common

FAMILIES = sorted(kernels.FAMILIES)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)


def test_table_gives_every_family_a_valid_choice_per_platform():
    for family in kernels.FAMILIES.values():
        assert family.tpu in ("tuned", "plain")
        assert family.gpu in ("tuned", "plain")


@pytest.mark.parametrize("family", FAMILIES)
def test_default_is_tuned_on_cpu_and_the_table_elsewhere(family):
    assert kernels.mode(family) == "auto"
    assert kernels.choice(family, "cpu") == "tuned"
    assert kernels.choice(family, "tpu") == kernels.FAMILIES[family].tpu
    for platform in ("cuda", "rocm"):
        assert kernels.choice(family, platform) == kernels.FAMILIES[family].gpu


def test_use_overrides_all_or_some_families_and_restores():
    a, b = FAMILIES[0], FAMILIES[1]
    with kernels.use("plain"):
        assert kernels.choice(a, "cpu") == kernels.choice(b, "cpu") == "plain"
        with kernels.use("tuned", a):
            assert kernels.choice(a, "tpu") == "tuned"
            assert kernels.choice(b, "tpu") == "plain"
        assert kernels.choice(a, "tpu") == "plain"
    assert kernels.mode(a) == kernels.mode(b) == "auto"


def test_environment_variable_sets_the_default_and_use_wins(monkeypatch):
    family = FAMILIES[0]
    monkeypatch.setenv(kernels.ENV_VAR, "plain")
    assert kernels.choice(family, "cpu") == "plain"
    with kernels.use("auto", family):
        assert kernels.choice(family, "cpu") == "tuned"
    monkeypatch.setenv(kernels.ENV_VAR, "tuned")
    assert kernels.choice(family, "tpu") == "tuned"


def test_bad_values_raise_one_line_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"^mode must be one of auto, tuned, plain; "):
        kernels.use("fast")
    with pytest.raises(ValueError, match="known families: metric_top_label"):
        kernels.use("plain", "no_such_family")
    monkeypatch.setenv(kernels.ENV_VAR, "fastest")
    with pytest.raises(ValueError) as err:
        kernels.mode(FAMILIES[0])
    message = str(err.value)
    assert "\n" not in message
    assert kernels.ENV_VAR in message and "'fastest'" in message
    assert "auto, tuned, plain" in message


def _set_entry(monkeypatch, family, **entries):
    entry = dataclasses.replace(kernels.FAMILIES[family], **entries)
    monkeypatch.setitem(kernels.FAMILIES, family, entry)


def _toy(traces):
    """A jitted function whose two formulations differ by a constant."""

    def tuned(x):
        traces.append("tuned")
        return x + 1.0

    def plain(x):
        traces.append("plain")
        return x + 2.0

    return jax.jit(kernels.dispatch(FAMILIES[0], tuned)(plain))


def test_each_mode_compiles_once_and_jit_does_not_reuse_a_stale_choice():
    traces = []
    f = _toy(traces)
    x = jnp.zeros(3)
    with kernels.use("tuned"):
        np.testing.assert_array_equal(f(x), 1.0)
    with kernels.use("plain"):
        np.testing.assert_array_equal(f(x), 2.0)
        np.testing.assert_array_equal(f(x), 2.0)
    with kernels.use("tuned"):
        np.testing.assert_array_equal(f(x), 1.0)
    assert traces == ["tuned", "plain"]


def test_auto_with_a_plain_table_entry_keeps_the_tuned_branch_on_cpu(monkeypatch):
    _set_entry(monkeypatch, FAMILIES[0], tpu="plain", gpu="plain")
    traces = []
    f = _toy(traces)
    np.testing.assert_array_equal(f(jnp.zeros(3)), 1.0)
    # Both formulations were traced; the CPU lowering kept the tuned one.
    assert sorted(traces) == ["plain", "tuned"]
    # Lowered for a TPU, the plain formulation is kept.
    exported = jax.export.export(f, platforms=["tpu"])(
        jax.ShapeDtypeStruct((3,), jnp.float32)
    )
    text = exported.mlir_module()
    assert "2.000000e+00" in text and "1.000000e+00" not in text


def test_gpu_column_is_separate_from_the_tpu_column(monkeypatch):
    _set_entry(monkeypatch, FAMILIES[0], tpu="tuned", gpu="plain")
    f = _toy([])
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)

    def constants(platform):
        text = jax.export.export(f, platforms=[platform])(spec).mlir_module()
        return "1.000000e+00" in text, "2.000000e+00" in text

    assert constants("cpu") == (True, False)  # tuned
    assert constants("tpu") == (True, False)  # tuned
    assert constants("cuda") == (False, True)  # plain
    assert constants("rocm") == (False, True)


def test_a_real_family_lowers_to_its_plain_formulation_off_the_cpu(monkeypatch):
    # Rows of 64 classes take the blocked packed-key reduction on the CPU
    # (bitcasts to uint32) and jnp.argmax elsewhere when the table says plain.
    _set_entry(monkeypatch, "metric_top_label", tpu="plain")
    specs = (
        jax.ShapeDtypeStruct((16, 64), jnp.float32),
        jax.ShapeDtypeStruct((16,), jnp.int32),
    )

    def text(platform):
        f = jax.jit(_common.top_label)
        return jax.export.export(f, platforms=[platform])(*specs).mlir_module()

    assert "bitcast_convert" in text("cpu")
    assert "bitcast_convert" not in text("tpu")
