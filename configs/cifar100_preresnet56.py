"""PreResNet-56 on CIFAR-100, the reweighted-risk paper's setup (App. D.1).

Command (from the repository root; needs CIFAR-100 as a TFDS array_record dir,
see docs/data.md)::

  python -m calib_jax.train --config configs/cifar100_preresnet56.py:objective=au_pxtau \
      --workdir /tmp/c100_pre56_au --config.dataset.data_dir=$TFDS_DATA_DIR

250 epochs, batch 128, SGD 0.1, momentum 0.9, L2 5e-4, x0.2 at 60/120/160.
Expected wall time on 1xH100: about 2 h (not measured here). That paper reports
(App. E.3, ECE [accuracy]): XE 7.09 [74.3], FL-53 2.49 [72.9], dual focal 1.00
[73.0], AURC 4.76 [71.9], AU_Pxtau 1.77 [73.9]. Every AU_Pxtau objective
(``au_pxtau``, ``au_pxtau_stopgrad``, ``au_pxtau_released``) uses that paper's
CIFAR-100 smoothing nu = 0.01 (App. E.2: 0.01 for every CIFAR-100 model but
WRN, which uses 0.1).
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, objective="ce", runlocal=False)
    c = common.cifar("cifar100", "preresnet56", "reweighted_risk", a.objective)
    c.num_epochs = 250.0  # CIFAR-100 runs 250 epochs in that paper
    c.schedule.boundaries = (60 / 250, 120 / 250, 160 / 250)
    # App. E.2: nu = 0.01 on CIFAR-100 (except WRN).
    if "au_pxtau" in c.loss.terms:
        c.loss.au_pxtau.nu = 0.01
    if a.runlocal:
        c.num_steps, c.batch_size, c.eval_batch_size = 2, 16, 16
    return c
