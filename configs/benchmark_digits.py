"""The calibration-under-shift benchmark on the bundled digits data (``make demo``).

Command (from the repository root)::

  python -m calib_jax.benchmark --config configs/benchmark_digits.py \
      --workdir /tmp/benchmark_digits

The whole grid: 23 training methods (every objective of
``calib_jax.objectives``, interleaved SB-ECE, MaC-Cal two-stage retraining
on the cross-entropy run and MC dropout: cross-entropy with dropout 0.1,
16 test-time samples) and a deep ensemble of 3 cross-entropy runs
(``ensemble(ce)``: ensembles 0, 1, 2 of seeds 0-2, 3-5, 6-8, the runs of
seeds 3-8 trained for them) x 16 post-hoc calibrators (14 run: Platt and
Beta calibration are binary-only, K = 2, and are skipped on the 10 digits
classes) x 3 seeds, an
MLP trained for 30 epochs, scored on the clean test set and on the 10 JAX
corruptions x 5 severities of it, with OOD detection against
``digits_patches`` (8x8 tiles of scikit-learn's bundled photographs) and
bootstrap intervals (200 resamples) of the clean-test metrics, Spiegelhalter's
test on every set and the ECE's consistency p-value (200 resamples) and the
CORP decompositions on the clean test set. Expected on a 2-core CPU: about 5
minutes (4 min 37 s at a load average of 3.9 falling to 1.8, most of it one
compile per method and per calibrator; the workdir's compilation cache
spares the seeds after the first their compiles: 6 min 32 s without it,
``JAX_ENABLE_COMPILATION_CACHE=false``; a rerun reads the finished cells
back). Variants:

- ``:quick``: 8 methods and a 2-member ``ensemble(ce)`` x 5 calibrators x 2
  seeds, 2 corruptions, 10 epochs (smoke run: 55 s at a load average of 1.1);
- ``:seeds=N``: N seeds (0..N-1).
"""

from calib_jax.benchmark import grid
from calib_jax.configs import common

QUICK_METHODS = (
    "ce",
    "focal",
    "ls",
    "acls",
    "sb_ece",
    "au_pxtau",
    "two_stage",
    "mc_dropout",
    "ensemble(ce)",
)
QUICK_CALIBRATORS = ("none", "ts:nll", "ts:sb_ece", "ets", "ts+classwise")


def get_config(arg=None):
    a = common.parse_arg(arg, quick=False, seeds=3)
    c = common.benchmark_base()
    t = c.train
    t.num_epochs = 10.0 if a.quick else 30.0
    t.log_every = 1000
    t.checkpoint_every = 1000
    t.shifts.corruptions = "gaussian_noise,contrast" if a.quick else "all"
    c.methods = QUICK_METHODS if a.quick else (*grid.METHODS, "ensemble(ce)")
    c.calibrators = QUICK_CALIBRATORS if a.quick else grid.CALIBRATORS
    c.seeds = tuple(range(2 if a.quick and a.seeds == 3 else a.seeds))
    # One ensemble per seed, so that ensemble g pairs with seed g.
    c.ensemble.num_groups = len(c.seeds)
    c.ensemble.size = 2 if a.quick else 3
    # MaC-Cal stage II on digits (configs/digits_two_stage.py's settings).
    c.two_stage.num_epochs = 10.0 if a.quick else 40.0
    return c
