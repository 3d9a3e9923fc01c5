"""Focal-loss family on digits: focal, FLSD-53, inverse focal, dual focal.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_focal.py:loss=focal_adaptive \
      --workdir /tmp/digits_flsd

``loss`` is one of focal (gamma=3), focal_adaptive (FLSD-53), inverse_focal,
dual_focal; ``gamma`` overrides the loss's default where it has one. Expected on
a 2-core CPU: about 30 s; test accuracy about 97%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, loss="focal", gamma=-1.0)
    common.choose(
        a.loss,
        dict.fromkeys(("focal", "focal_adaptive", "inverse_focal", "dual_focal")),
    )
    term = dict(name=a.loss, weight=1.0)
    if a.gamma >= 0 and a.loss != "focal_adaptive":
        term["gamma"] = a.gamma
    c = common.base()
    c.loss = common.loss(term)
    return c
