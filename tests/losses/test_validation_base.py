"""The validation base: input preparation and scalar hyperparameter checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax.losses import _validation_base as vb


def test_prepare_upcasts_and_builds_the_mask():
    logits = jnp.ones((3, 4), jnp.bfloat16)
    z, y, mask = vb.prepare(logits, np.array([0, 1, 3], np.int64))
    assert z.dtype == jnp.float32 and y.dtype == jnp.int32
    np.testing.assert_array_equal(mask, [True, True, True])
    with jax.enable_x64(True):
        z64, _, _ = vb.prepare(np.ones((2, 2)), np.array([0, 1]))
        assert z64.dtype == jnp.float64
    where = np.array([True, False, True])
    np.testing.assert_array_equal(vb.prepare(logits, [0, 1, 2], where)[2], where)


@pytest.mark.parametrize(
    "logits, labels, where, kind, message",
    [
        (np.ones((2, 3), np.int32), [0, 1], None, TypeError, "floating point"),
        (np.ones((2, 3)), [0.0, 1.0], None, TypeError, "integer class ids"),
        (np.ones((2, 3)), [0, 1], np.ones(2), TypeError, "bool mask"),
        (np.ones(3), [0], None, ValueError, "shape [B, K]"),
        (np.ones((2, 3)), [[0, 1]], None, ValueError, "shape [B]"),
        (np.ones((2, 3)), [0, 1, 2], None, ValueError, "batch size"),
        (np.ones((2, 3)), [0, 1], np.ones(3, bool), ValueError, "where must"),
        (np.ones((2, 3)), [0, 3], None, ValueError, "found 3 at row 1"),
    ],
)
def test_prepare_names_the_problem(logits, labels, where, kind, message):
    with pytest.raises(kind) as err:
        vb.prepare(np.asarray(logits, getattr(logits, "dtype", None)), labels, where)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_value_checks_skip_excluded_rows_and_tracers():
    logits = np.zeros((3, 2), np.float32)
    logits[1, 0] = np.nan
    vb.prepare(logits, [0, 5, 1], [True, False, True])  # row 1 is excluded
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\) \(first: row 1\)"):
        vb.prepare(logits, [0, 1, 1])
    out = jax.jit(lambda z, y: vb.prepare(z, y)[0])(logits, np.array([0, 9, 1]))
    assert np.isnan(np.asarray(out)[1, 0])


def test_check_logits_upcasts_and_checks_the_rank():
    assert vb.check_logits(jnp.ones((2, 3), jnp.float16)).dtype == jnp.float32
    with pytest.raises(ValueError, match=r"shape \[B, K\]"):
        vb.check_logits(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="floating point"):
        vb.check_logits(np.ones((2, 3), np.int32))


@pytest.mark.parametrize(
    "check, value, message",
    [
        (vb.check_positive, 0.0, "x must be > 0, got 0.0."),
        (vb.check_nonnegative, -1, "x must be >= 0, got -1.0."),
        (vb.check_unit_interval, 0.0, "x must lie in (0, 1], got 0.0."),
        (vb.check_open_unit_interval, 1.0, "x must lie in (0, 1), got 1.0."),
        (vb.check_at_least_one, 0.5, "x must be >= 1, got 0.5."),
        (vb.check_bool, 1, "x must be True or False, got 1."),
    ],
)
def test_scalar_checks_raise_one_line_naming_the_value(check, value, message):
    with pytest.raises(ValueError) as err:
        check("x", value)
    assert str(err.value) == message
    # Traced values pass (they are checked nowhere: no host sync under jit).
    if check is not vb.check_bool:

        @jax.jit
        def traced(v):
            check("x", v)
            return v

        traced(jnp.float32(value))


def test_scalar_checks_accept_their_domain():
    vb.check_positive("x", 1e-9)
    vb.check_nonnegative("x", 0)
    vb.check_unit_interval("x", 0.0, closed_left=True)
    vb.check_open_unit_interval("x", 0.5)
    vb.check_at_least_one("x", 1)
    assert vb.check_bool("x", np.bool_(True)) is True
    assert vb.check_num_bins(np.int64(3)) == 3
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="num_bins"):
            vb.check_num_bins(bad)


def test_variant_checks_list_the_valid_names():
    assert vb.check_variant("paper") == "paper"
    with pytest.raises(ValueError, match="Unknown variant='x'; valid: 'paper', 'rel"):
        vb.check_variant("x")
    with pytest.raises(ValueError, match=r"^f\(variant='released_code'\) does not"):
        vb.reject("f", "tau")
