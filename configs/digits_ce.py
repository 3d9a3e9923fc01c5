"""Cross-entropy MLP on the bundled digits data: the quick CPU reference run.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_ce.py --workdir /tmp/digits_ce

Expected on a 2-core CPU: about 30 s including evaluation on 50 shifted test
sets; test accuracy about 97%, test ECE (15 equal-width bins, l1) about 1-2%.
Variants: ``:model=cnn`` for the small CNN.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, model="mlp")
    c = common.base()
    c.model.name = a.model
    c.loss = common.loss(dict(name="cross_entropy", weight=1.0))
    return c
