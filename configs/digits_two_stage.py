"""MaC-Cal stage II on digits: masked retraining of a new bottleneck head.

Stage I is any finished run; stage II freezes its features and trains a new
two-layer head under Bernoulli(q) weight masks with the adaptive q of Eqs. 12-13.

Commands (from the repository root)::

  python -m calib_jax.train --config configs/digits_ce.py --workdir /tmp/stage1
  python -m calib_jax.train --config configs/digits_two_stage.py:stage1=/tmp/stage1 \
      --workdir /tmp/stage2

Stage II uses plain SGD (no momentum, no weight decay), so masked weights do not
move (Eq. 11). The paper retrains "e.g., 5 epochs" of CIFAR (about 2000 steps);
digits has 9 steps an epoch, so the default here is 40 epochs (360 steps) at a
learning rate of 0.3. Expected on a 2-core CPU: about 15 s; test accuracy about
97-98%.
"""

from calib_jax.configs import common


def get_config(arg=None):
    a = common.parse_arg(arg, stage1="", gamma=0.9, epochs=40.0)
    c = common.base()
    c.two_stage.enabled = True
    c.two_stage.stage1_workdir = a.stage1
    c.two_stage.gamma = a.gamma
    c.optimizer.name = "sgd"
    c.optimizer.learning_rate = 0.3
    c.optimizer.momentum = 0.0
    c.optimizer.weight_decay = 0.0
    c.schedule.name = "constant"
    c.num_epochs = a.epochs
    c.checkpoint_every = 20
    return c
