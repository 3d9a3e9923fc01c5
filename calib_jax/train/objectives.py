"""Named training objectives: the loss terms of each method the configs offer.

Each entry is a tuple of loss-term dicts for :func:`calib_jax.losses.composite`
(``{name, weight=1, **hyperparameters}``); hyperparameters not given take the
papers' defaults of the loss functions. The configs (``configs/common.py``)
and the benchmark grid (:mod:`calib_jax.benchmark.grid`) both read this table.
"""

from __future__ import annotations

OBJECTIVES: dict[str, tuple[dict, ...]] = {
    "ce": (dict(name="cross_entropy"),),
    "focal": (dict(name="focal", gamma=3.0),),
    "flsd53": (dict(name="focal_adaptive"),),
    "inverse_focal": (dict(name="inverse_focal"),),
    "dual_focal": (dict(name="dual_focal"),),
    "ls": (dict(name="label_smoothing", epsilon=0.1),),
    "mbls": (dict(name="cross_entropy"), dict(name="mbls")),
    "acls": (dict(name="cross_entropy"), dict(name="acls")),
    # ACLS as cvlab-yonsei/ACLS computes it (calibrate/losses/acls.py), with its
    # default weights (pos_lambda 1, neg_lambda 0.1, alpha 0.1) and margin 10.
    "acls_released": (
        dict(name="cross_entropy"),
        dict(name="acls", variant="released_code"),
    ),
    "cpc": (dict(name="cross_entropy"), dict(name="cpc")),
    "mdca": (dict(name="cross_entropy"), dict(name="mdca")),
    "mmce": (dict(name="cross_entropy"), dict(name="mmce")),
    "avuc": (dict(name="cross_entropy"), dict(name="avuc")),
    "avuc_gs": (dict(name="cross_entropy"), dict(name="avuc_gs")),
    "s_avuc": (dict(name="cross_entropy"), dict(name="s_avuc")),
    "sb_ece": (dict(name="cross_entropy"), dict(name="sb_ece")),
    "aurc": (dict(name="aurc"),),
    "au_pxtau": (dict(name="au_pxtau"),),
    # AU_Pxτ without the weight-gradient term of Eq. (27) (constant weights).
    "au_pxtau_stopgrad": (dict(name="au_pxtau", weight_grad=False),),
    # AU_Pxτ as han678/CalibWeightedRisk computes it (loss/selectAU.py): the
    # score on softmax(softmax(z)), 64 bins, hist_sigma 0.05, batch-quantile τ.
    "au_pxtau_released": (
        dict(name="au_pxtau", variant="released_code", num_bins=64, nu=0.05),
    ),
}
