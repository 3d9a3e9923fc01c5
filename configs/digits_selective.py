"""Selective-risk training on digits: the AURC or AU_Pxtau reweighted losses.

Command (from the repository root)::

  python -m calib_jax.train --config configs/digits_selective.py:loss=au_pxtau \
      --workdir /tmp/digits_aupxtau

These losses reweight the per-sample cross-entropy and replace it (the
reweighted-risk paper trains with them alone). Expected on a 2-core CPU: about
30 s. Measured test accuracy (seed 0):

- ``loss=aurc``: about 97%;
- ``loss=au_pxtau`` with the paper's defaults (coverage 0.9, nu 0.1) and the
  gradient of its Eq. (27): about 43% (about 65% with SGD 0.1, L2 5e-4). The weight
  gradient lowers the confidence of every sample below tau in proportion to
  its loss, and on digits trained from scratch the confidences stay low;
- ``loss=au_pxtau,variant=released_code`` (the authors' code: the score on
  softmax(softmax(z)), ``losses.au_pxtau(..., variant='released_code')``,
  64 bins, nu 0.05): see the benchmark's ``au_pxtau_released``;
- ``loss=au_pxtau,weight_grad=false`` (the weights held constant in the
  gradient, ``losses.au_pxtau(..., weight_grad=False)``): about 98%, test ECE
  about 1.2%.

The benchmark report compares both AU_Pxtau variants.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, loss="au_pxtau", weight_grad=True, variant="paper")
    common.choose(a.loss, dict.fromkeys(("aurc", "au_pxtau")))
    c = common.base()
    term = dict(name=a.loss, weight=1.0)
    if a.loss == "au_pxtau":
        term["weight_grad"] = a.weight_grad
        if a.variant != "paper":
            term.update(variant=a.variant, num_bins=64, nu=0.05)
    elif not a.weight_grad:
        raise ValueError(
            "weight_grad applies to loss=au_pxtau only (aurc's weights are constants)."
        )
    elif a.variant != "paper":
        raise ValueError(
            f"variant={a.variant!r} applies to loss=au_pxtau only (aurc has none)."
        )
    c.loss = common.loss(term)
    return c
