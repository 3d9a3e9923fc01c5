"""Interleaved training (soft-calibration paper, App. B) on digits.

Each epoch first optimises cross-entropy on the majority split of the training
set, then the soft calibration loss alone on the held-out 10%.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_interleaved.py:secondary=sb_ece \
      --workdir /tmp/digits_interleaved

Expected on a 2-core CPU: about 30 s; test accuracy about 97%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, secondary="sb_ece", holdout=0.1, weight=1.0)
    common.choose(a.secondary, dict.fromkeys(("sb_ece", "s_avuc", "mmce", "mdca")))
    c = common.base()
    c.loss = common.loss(dict(name="cross_entropy", weight=1.0))
    c.interleaved.enabled = True
    c.interleaved.holdout_fraction = a.holdout
    c.interleaved.secondary = common.loss(
        dict(name=a.secondary, weight=a.weight), what="interleaved.secondary"
    )
    return c
