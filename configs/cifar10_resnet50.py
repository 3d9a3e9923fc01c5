"""ResNet-50 (CIFAR stem) on CIFAR-10, the ACLS paper's setup (Sec. 5).

Command (from the repository root; needs CIFAR-10 as a TFDS array_record dir,
see docs/data.md)::

  python -m calib_jax.train --config configs/cifar10_resnet50.py:objective=acls \
      --workdir /tmp/c10_r50_acls --config.dataset.data_dir=$TFDS_DATA_DIR

350 epochs, batch 128, SGD 0.1, momentum 0.9, L2 5e-4, /10 at epochs 150 and
250. Expected wall time on 1xH100: about 4 h (not measured here). The ACLS
paper reports (Table 3, 15-bin ECE): CE 93.20% / 5.85%, MbLS 95.25% / 1.16%,
CPC 95.04% / 3.91%, ACLS 95.40% / 1.12%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, objective="ce", runlocal=False)
    c = common.cifar("cifar10", "resnet50", "acls", a.objective)
    if a.runlocal:
        c.num_steps, c.batch_size, c.eval_batch_size = 2, 16, 16
    return c
