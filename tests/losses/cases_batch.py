"""Property-suite cases of the batch-level losses (see _harness.py).

``avuc_gs`` stops gradients on purpose (App. F of the soft-calibration paper),
so its gradient is not the derivative of its value: it is marked
``gradient_is_derivative=False`` and tests/losses/test_avuc.py checks the
intended gradient.
"""

from _harness import LossCase
from _reference_batch import (
    ref_au_pxtau,
    ref_aurc,
    ref_avuc,
    ref_mdca,
    ref_mmce,
    ref_s_avuc,
    ref_sb_ece,
)
from _reference_released import (
    ref_au_pxtau_released,
    ref_mmce_released,
    ref_sb_ece_released,
)

from calib_jax.losses._au_pxtau import au_pxtau
from calib_jax.losses._aurc import aurc
from calib_jax.losses._avuc import avuc, avuc_gs, s_avuc
from calib_jax.losses._mdca import mdca
from calib_jax.losses._mmce import mmce
from calib_jax.losses._soft_ece import sb_ece


def _case(name, fn, ref, **kw):
    return LossCase(name=name, fn=fn, ref=ref, batch_level=True, **kw)


CASES = [
    # SB-ECE, Eqs. (11)-(12): the default (lb, p=2) and bin with p=1, sharper T.
    _case("sb_ece", sb_ece, ref_sb_ece),
    _case(
        "sb_ece_released_code",
        sb_ece,
        ref_sb_ece_released,
        hparams={"variant": "released_code", "temperature": 0.02},
    ),
    _case(
        "sb_ece_bin_p1",
        sb_ece,
        ref_sb_ece,
        hparams={"kind": "bin", "p": 1.0, "temperature": 1e-3, "num_bins": 10},
    ),
    # AvUC: the hard accurate/uncertain split may be straddled by a difference.
    _case("avuc", avuc, ref_avuc, smooth=False),
    _case("avuc_gs", avuc_gs, ref_avuc, smooth=False, gradient_is_derivative=False),
    _case(
        "s_avuc_kappa0.3_T0.25",
        s_avuc,
        ref_s_avuc,
        hparams={"kappa": 0.3, "temperature": 0.25},
    ),
    # MMCE: |r_i - r_j| has kinks where two confidences meet.
    _case("mmce", mmce, ref_mmce, smooth=False),
    _case("mmce_weighted", mmce, ref_mmce, hparams={"weighted": True}, smooth=False),
    _case(
        "mmce_weighted_released_code",
        mmce,
        ref_mmce_released,
        hparams={"weighted": True, "variant": "released_code"},
        smooth=False,
    ),
    _case("mdca", mdca, ref_mdca, num_classes=7),
    # AURC: the ranking is piecewise constant in the logits.
    _case("aurc", aurc, ref_aurc, smooth=False),
    _case(
        "aurc_softmax_margin",
        aurc,
        ref_aurc,
        hparams={"csf": "softmax_margin"},
        smooth=False,
    ),
    # AU_Pxτ: the histogram counts are piecewise constant in the logits.
    _case("au_pxtau", au_pxtau, ref_au_pxtau, smooth=False),
    _case(
        "au_pxtau_released_code",
        au_pxtau,
        ref_au_pxtau_released,
        hparams={"variant": "released_code", "num_bins": 64, "nu": 0.05},
        smooth=False,
        num_classes=10,
    ),
    _case(
        "au_pxtau_released_code_margin",
        au_pxtau,
        ref_au_pxtau_released,
        hparams={
            "variant": "released_code",
            "csf": "softmax_margin",
            "coverage": 0.6,
            "nu": 0.02,
        },
        smooth=False,
    ),
    _case(
        "au_pxtau_neg_entropy",
        au_pxtau,
        ref_au_pxtau,
        hparams={"csf": "neg_entropy", "coverage": 0.6, "num_bins": 10},
        smooth=False,
    ),
    _case(
        "au_pxtau_softmax_margin_tau",
        au_pxtau,
        ref_au_pxtau,
        hparams={"csf": "softmax_margin", "tau": 0.5, "nu": 0.05},
        smooth=False,
    ),
]
