"""WideResNet-28-10 on CIFAR-10, the soft-calibration paper's setup (App. G).

Command (from the repository root; needs CIFAR-10 as a TFDS array_record dir,
see docs/data.md)::

  python -m calib_jax.train --config configs/cifar10_wrn28_10.py:objective=s_avuc \
      --workdir /tmp/c10_wrn_savuc --config.dataset.data_dir=$TFDS_DATA_DIR

200 epochs, SGD 0.1, momentum 0.9, L2 5e-4, global batch 512. Expected wall
time on 1xH100: about 3 h (not measured here). The paper reports (Table 2, NLL
primary): accuracy 95.5%, ECE 5.59% (l2, equal-mass); with S-AvUC 95.4% /
5.87%, with SB-ECE 95.4% / 5.84%. ``:objective`` takes any key of
``configs.common.OBJECTIVES``; ``runlocal`` shrinks the run to 2 steps.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, objective="ce", runlocal=False)
    c = common.cifar("cifar10", "wrn28_10", "soft_calibration", a.objective)
    if a.runlocal:
        c.num_steps, c.batch_size, c.eval_batch_size = 2, 16, 16
    return c
