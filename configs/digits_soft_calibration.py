"""Cross-entropy plus a batch-level calibration loss on digits.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_soft_calibration.py:loss=s_avuc,weight=1 \
      --workdir /tmp/digits_savuc

``loss`` is one of sb_ece, s_avuc (the soft-calibration paper's secondary
losses), avuc, avuc_gs, mmce, mdca; ``weight`` is the paper's beta. The batch
statistics span the global batch (``--config.calibration_stats=per_device`` for
the per-core variant). Expected on a 2-core CPU: about 30 s; test accuracy
about 97%.
"""

from calib_jax.configs import common

SECONDARY = ("sb_ece", "s_avuc", "avuc", "avuc_gs", "mmce", "mdca")


def get_config(arg=None):
    a = common.parse_arg(arg, loss="sb_ece", weight=1.0)
    common.choose(a.loss, dict.fromkeys(SECONDARY))
    c = common.base()
    c.loss = common.loss(
        dict(name="cross_entropy", weight=1.0), dict(name=a.loss, weight=a.weight)
    )
    return c
