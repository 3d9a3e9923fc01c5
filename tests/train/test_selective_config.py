"""configs/digits_selective.py: AU_Pxtau with and without the weight gradient."""

from __future__ import annotations

import pytest

from calib_jax import objectives
from calib_jax.train import loop
from configs import digits_selective


def _terms(arg):
    return objectives.loss_terms(digits_selective.get_config(arg).loss)


def test_weight_grad_switch_reaches_the_loss_term():
    (term,) = _terms("loss=au_pxtau")
    assert term["name"] == "au_pxtau" and term["weight_grad"] is True
    (term,) = _terms("loss=au_pxtau,weight_grad=false")
    assert term["weight_grad"] is False
    (term,) = _terms("loss=aurc")
    assert term["name"] == "aurc" and "weight_grad" not in term
    with pytest.raises(ValueError, match="applies to loss=au_pxtau only"):
        digits_selective.get_config("loss=aurc,weight_grad=false")
    (term,) = _terms("loss=au_pxtau,variant=released_code")
    assert term["variant"] == "released_code" and term["num_bins"] == 64
    with pytest.raises(ValueError, match="applies to loss=au_pxtau only"):
        digits_selective.get_config("loss=aurc,variant=released_code")


@pytest.mark.long
def test_au_pxtau_with_constant_weights_trains_digits(tmp_path):
    """Without Eq. (27)'s weight-gradient term AU_Pxtau trains like cross-entropy."""
    c = digits_selective.get_config("loss=au_pxtau,weight_grad=false")
    c.num_epochs = 15.0
    c.shifts.corruptions = "none"
    result = loop.train_and_evaluate(c, tmp_path, progress=False)
    assert result["test/accuracy"] >= 0.95
    assert result["test/ece"] < 0.05


@pytest.mark.long
def test_au_pxtau_released_code_trains_digits(tmp_path):
    """The released scoring (softmax of softmax) trains with the weight
    gradient on, where the paper's equations collapse (au_pxtau docstring)."""
    c = digits_selective.get_config("loss=au_pxtau,variant=released_code")
    c.num_epochs = 15.0
    c.shifts.corruptions = "none"
    result = loop.train_and_evaluate(c, tmp_path, progress=False)
    assert result["test/accuracy"] >= 0.95
