"""ResNet-110 on CIFAR-10, the reweighted-risk paper's setup (App. D.1).

Command (from the repository root; needs CIFAR-10 as a TFDS array_record dir,
see docs/data.md)::

  python -m calib_jax.train --config configs/cifar10_resnet110.py:objective=au_pxtau \
      --workdir /tmp/c10_r110_au --config.dataset.data_dir=$TFDS_DATA_DIR

200 epochs, batch 128, SGD 0.1, momentum 0.9, L2 5e-4, x0.2 at 60/120/160.
Expected wall time on 1xH100: about 2 h (not measured here). That paper reports
(App. E.3, ECE [accuracy]): XE 3.00 [94.5], FL-53 4.39 [93.8], dual focal 1.93
[93.7], AURC 2.36 [93.0], AU_Pxtau 1.50 [92.4].
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, objective="ce", runlocal=False)
    c = common.cifar("cifar10", "resnet110", "reweighted_risk", a.objective)
    if a.runlocal:
        c.num_steps, c.batch_size, c.eval_batch_size = 2, 16, 16
    return c
