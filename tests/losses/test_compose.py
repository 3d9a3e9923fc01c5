"""The composition validates a term by evaluating its loss abstractly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from calib_jax import losses
from calib_jax.losses._compose import compose


def test_a_domain_written_only_in_the_loss_is_checked_when_binding():
    seen = []

    def toy(logits, labels, *, scale=1.0, where=None):
        seen.append(logits)
        if scale > 2.0:
            raise ValueError(f"scale must be <= 2, got {scale}.")
        return jnp.sum(logits, axis=1) * scale

    registry = {"toy": toy}
    with pytest.raises(ValueError) as err:
        compose([{"name": "toy", "scale": 3.0}], registry=registry, batch_level=set())
    assert str(err.value) == "toy.scale must be <= 2, got 3.0."
    objective = compose(
        [{"name": "toy", "scale": 2.0}], registry=registry, batch_level=set()
    )
    # Binding traced the loss on an abstract batch: nothing was computed.
    assert len(seen) == 2 and all(isinstance(z, jax.core.Tracer) for z in seen)
    total, _ = objective(jnp.ones((2, 3)), jnp.zeros(2, jnp.int32))
    assert float(total) == 6.0


@pytest.mark.parametrize(
    "term, message",
    [
        # The loss's own domain (sb_ece needs p >= 1), not a second table's.
        ({"name": "sb_ece", "p": 0.5}, "sb_ece.p must be >= 1, got 0.5."),
        ({"name": "avuc", "kappa": 2.0}, "avuc.kappa must lie in [0, 1], got 2.0."),
        ({"name": "s_avuc", "kappa": 1.0}, "s_avuc.kappa must lie in (0, 1), got 1.0."),
        ({"name": "focal", "gamma": -1.0}, "focal.gamma must be >= 0, got -1.0."),
        (
            {"name": "acls", "variant": "nope"},
            (
                "loss term 'acls': Unknown variant='nope'; valid: 'paper', "
                "'released_code'."
            ),
        ),
        (
            {"name": "au_pxtau", "tau": 0.5, "coverage": 0.5},
            "loss term 'au_pxtau': Give at most one of tau and coverage, not both.",
        ),
    ],
)
def test_bad_term_names_the_term_and_the_value(term, message):
    with pytest.raises(ValueError) as err:
        losses.composite([term])
    assert str(err.value) == message


def test_values_inside_every_domain_bind():
    losses.get_loss("sb_ece", p=1.0, temperature=0.01, num_bins=5)
    losses.get_loss("au_pxtau", coverage=1.0, nu=0.5, csf="neg_entropy")
    losses.get_loss("label_smoothing", epsilon=0.0, off_target="others")
