"""The LOSSES registry, get_loss and the composition of terms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import losses


def _batch(b=16, k=4, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, k)).astype(np.float32)
    labels = rng.integers(0, k, size=b).astype(np.int32)
    return logits, labels


@pytest.mark.long
def test_registry_names_and_kinds():
    expected = {
        "cross_entropy", "focal", "focal_adaptive", "inverse_focal", "dual_focal",
        "label_smoothing", "brier", "mbls", "acls", "cpc", "sb_ece", "avuc",
        "avuc_gs", "s_avuc", "mmce", "mdca", "aurc", "au_pxtau",
    }  # fmt: skip
    assert set(losses.LOSSES) == expected
    assert losses.BATCH_LEVEL <= expected
    logits, labels = _batch()
    for name, fn in losses.LOSSES.items():
        out = losses.get_loss(name)(logits, labels)
        want = () if name in losses.BATCH_LEVEL else (16,)
        assert out.shape == want, name


def test_composite_means_per_example_terms_and_adds_batch_terms():
    logits, labels = _batch()
    mask = np.arange(16) % 4 != 0
    objective = losses.composite(
        [
            dict(name="cross_entropy"),
            dict(name="focal", weight=0.5, gamma=2.0),
            dict(name="sb_ece", weight=2.0, num_bins=10),
        ]
    )
    total, logs = jax.jit(objective)(logits, labels, jnp.asarray(mask))
    ce = float(np.mean(np.asarray(losses.cross_entropy(logits, labels))[mask]))
    fl = float(np.mean(np.asarray(losses.focal(logits, labels, gamma=2.0))[mask]))
    sb = float(losses.sb_ece(logits[mask], labels[mask], num_bins=10))
    np.testing.assert_allclose(logs["loss/cross_entropy"], ce, rtol=1e-6)
    np.testing.assert_allclose(logs["loss/focal"], fl, rtol=1e-6)
    np.testing.assert_allclose(logs["loss/sb_ece"], sb, rtol=1e-5)
    np.testing.assert_allclose(total, ce + 0.5 * fl + 2.0 * sb, rtol=1e-5)
    np.testing.assert_allclose(logs["loss/total"], total)


def test_repeated_terms_get_distinct_log_keys():
    objective = losses.composite(
        [dict(name="focal", gamma=1.0), dict(name="focal", gamma=3.0)]
    )
    _, logs = objective(*_batch())
    assert {"loss/focal", "loss/focal_2"} <= set(logs)
    assert float(logs["loss/focal"]) > float(logs["loss/focal_2"])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: losses.get_loss("xent"), "Unknown loss 'xent'. Valid names: acls,"),
        (lambda: losses.get_loss("sb_ece", temperature=0.0), "temperature must be > 0"),
        (
            lambda: losses.get_loss("sb_ece", temperature=-1.0),
            "temperature must be > 0",
        ),
        (lambda: losses.get_loss("sb_ece", num_bins=0), "num_bins must be >= 1"),
        (lambda: losses.get_loss("au_pxtau", nu=0.0), "nu must be > 0"),
        (
            lambda: losses.get_loss("au_pxtau", coverage=0.0),
            "coverage must lie in (0, 1]",
        ),
        (
            lambda: losses.get_loss("au_pxtau", coverage=1.5),
            "coverage must lie in (0, 1]",
        ),
        (lambda: losses.get_loss("focal", gama=2.0), "has no hyperparameter 'gama'"),
        (lambda: losses.composite([dict(name="nope")]), "Unknown loss 'nope'"),
        (lambda: losses.composite([]), "non-empty list"),
        (lambda: losses.composite([dict(weight=1.0)]), "with a 'name' key"),
        (
            lambda: losses.composite([dict(name="s_avuc", temperature=0.0)]),
            "temperature must be > 0",
        ),
    ],
)
def test_bad_hyperparameters_and_names_raise_value_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["cross_entropy", "sb_ece", "au_pxtau", "acls"])
def test_shape_mismatch_raises_value_error(name):
    logits, labels = _batch()
    with pytest.raises(ValueError, match="batch size"):
        losses.get_loss(name)(logits, labels[:-1])
    with pytest.raises(ValueError, match="batch size"):
        losses.composite([dict(name=name)])(logits, labels[:-1])
    with pytest.raises(ValueError, match=r"shape \[B, K\]"):
        losses.get_loss(name)(logits[0], labels)


def test_direct_calls_validate_concrete_hyperparameters():
    logits, labels = _batch()
    with pytest.raises(ValueError, match="temperature"):
        losses.sb_ece(logits, labels, temperature=0.0)
    with pytest.raises(ValueError, match="num_bins"):
        losses.au_pxtau(logits, labels, num_bins=0)
