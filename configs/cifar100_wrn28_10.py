"""WideResNet-28-10 on CIFAR-100, the soft-calibration paper's setup (App. G).

Command (from the repository root; needs CIFAR-100 as a TFDS array_record dir,
see docs/data.md)::

  python -m calib_jax.train --config configs/cifar100_wrn28_10.py:objective=sb_ece \
      --workdir /tmp/c100_wrn_sbece --config.dataset.data_dir=$TFDS_DATA_DIR

200 epochs, SGD 0.1, momentum 0.9, L2 5e-4, global batch 512. Expected wall
time on 1xH100: about 3 h (not measured here). The paper reports (Table 2, NLL
primary): accuracy 78.7%, ECE 9.10% (l2, equal-mass); with SB-ECE 77.7% /
6.86%, with S-AvUC 78.6% / 6.10%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, objective="ce", runlocal=False)
    c = common.cifar("cifar100", "wrn28_10", "soft_calibration", a.objective)
    if a.runlocal:
        c.num_steps, c.batch_size, c.eval_batch_size = 2, 16, 16
    return c
