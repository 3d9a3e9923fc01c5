"""Property-suite cases of the per-example losses (see _harness.py).

``smooth=False`` marks losses whose value or slope jumps somewhere in logit
space (hinges, the FLSD-53 gamma switch, the dual-focal arg-max, ACLS's
arg-max/arg-min), so check_grads uses its small step. The margin regularizers
use wide logits (``logit_scale``) or small margins so that their hinges are
active in the random batch; otherwise they would be tested at 0 only.
``acls_logit_grad`` returns ``[B, K]`` and is tested in test_margin.py.
"""

from _harness import LossCase
from _reference import (
    ref_acls,
    ref_brier,
    ref_cpc,
    ref_cross_entropy,
    ref_dual_focal,
    ref_focal,
    ref_focal_adaptive,
    ref_inverse_focal,
    ref_label_smoothing,
    ref_mbls,
)
from _reference_released import ref_acls_released, ref_dual_focal_released

from calib_jax.losses._cpc import cpc
from calib_jax.losses._focal import dual_focal, focal, focal_adaptive, inverse_focal
from calib_jax.losses._margin import acls, mbls
from calib_jax.losses._primary import brier, cross_entropy, label_smoothing


def _case(name, fn, ref, **kw):
    return LossCase(name=name, fn=fn, ref=ref, batch_level=False, **kw)


CASES = [
    _case("cross_entropy", cross_entropy, ref_cross_entropy),
    _case("cross_entropy_k2", cross_entropy, ref_cross_entropy, num_classes=2),
    _case("label_smoothing", label_smoothing, ref_label_smoothing),
    _case(
        "label_smoothing_others_eps0.2_k10",
        label_smoothing,
        ref_label_smoothing,
        hparams={"epsilon": 0.2, "off_target": "others"},
        num_classes=10,
    ),
    _case("brier", brier, ref_brier),
    _case("brier_k2_wide", brier, ref_brier, num_classes=2, logit_scale=6.0),
    _case("focal", focal, ref_focal),
    _case(
        "focal_gamma0.5_k10",
        focal,
        ref_focal,
        hparams={"gamma": 0.5},
        num_classes=10,
    ),
    _case("focal_gamma1_k2", focal, ref_focal, hparams={"gamma": 1.0}, num_classes=2),
    # FLSD-53: gamma jumps at p_y = 0.2; scale 2 gives rows on both sides.
    _case("focal_adaptive", focal_adaptive, ref_focal_adaptive, smooth=False),
    _case(
        "focal_adaptive_k10_thr0.3",
        focal_adaptive,
        ref_focal_adaptive,
        hparams={"threshold": 0.3, "gamma_below": 4.0, "gamma_above": 1.5},
        num_classes=10,
        smooth=False,
    ),
    _case("inverse_focal", inverse_focal, ref_inverse_focal),
    _case(
        "inverse_focal_gamma1_k10",
        inverse_focal,
        ref_inverse_focal,
        hparams={"gamma": 1.0},
        num_classes=10,
    ),
    _case("dual_focal", dual_focal, ref_dual_focal, smooth=False),
    _case(
        "dual_focal_reweighted_risk_description_gamma2_k10",
        dual_focal,
        ref_dual_focal,
        hparams={"gamma": 2.0, "variant": "reweighted_risk_description"},
        num_classes=10,
        smooth=False,
    ),
    _case(
        "dual_focal_released_code_gamma2_k10",
        dual_focal,
        ref_dual_focal_released,
        hparams={"gamma": 2.0, "variant": "released_code"},
        num_classes=10,
        smooth=False,
    ),
    _case("dual_focal_k2", dual_focal, ref_dual_focal, num_classes=2, smooth=False),
    # Default margin 10: logits of scale 8 put most rows past the margin.
    _case("mbls", mbls, ref_mbls, logit_scale=8.0, smooth=False),
    _case(
        "mbls_margin2_alpha0.5_k10",
        mbls,
        ref_mbls,
        hparams={"margin": 2.0, "alpha": 0.5},
        num_classes=10,
        smooth=False,
    ),
    _case("acls", acls, ref_acls, logit_scale=8.0, smooth=False),
    _case(
        "acls_released_code_margin3_k10",
        acls,
        ref_acls_released,
        hparams={"margin": 3.0, "variant": "released_code"},
        num_classes=10,
        smooth=False,
        # The released max is detached in the lambda_2 term: test_released.py
        # checks that gradient against the reference.
        gradient_is_derivative=False,
    ),
    _case(
        "acls_margin3_k10",
        acls,
        ref_acls,
        hparams={"margin": 3.0, "lambda_1": 0.2, "lambda_2": 0.05},
        num_classes=10,
        smooth=False,
    ),
    _case("cpc", cpc, ref_cpc),
    _case(
        "cpc_k10",
        cpc,
        ref_cpc,
        hparams={"lambda_1": 0.5, "lambda_2": 0.2},
        num_classes=10,
    ),
]
