"""Selective-risk training on digits: the AURC or AU_Pxtau reweighted losses.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_selective.py:loss=au_pxtau \
      --workdir /tmp/digits_aupxtau

These losses reweight the per-sample cross-entropy and replace it (the
reweighted-risk paper trains with them alone). Expected on a 2-core CPU: about
30 s; test accuracy about 97%.
"""

from configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, loss="au_pxtau")
    common.choose(a.loss, dict.fromkeys(("aurc", "au_pxtau")))
    c = common.base()
    c.loss = (dict(name=a.loss, weight=1.0),)
    return c
