"""Label smoothing on digits (target mass 1 - eps + eps/K, eps/K elsewhere).

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_label_smoothing.py:epsilon=0.1 \
      --workdir /tmp/digits_ls

Expected on a 2-core CPU: about 30 s; test accuracy about 97%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, epsilon=0.1)
    c = common.base()
    c.loss = common.loss(dict(name="label_smoothing", weight=1.0, epsilon=a.epsilon))
    return c
