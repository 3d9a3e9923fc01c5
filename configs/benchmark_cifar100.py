"""The calibration-under-shift benchmark on CIFAR-100 with CIFAR-100-C.

Command (from the repository root; needs CIFAR-100 as a TFDS array_record
directory and the published CIFAR-100-C ``.npy`` directory, see docs/data.md)::

  python -m calib_jax.benchmark --config configs/benchmark_cifar100.py \
      --workdir /tmp/bench_c100 --config.train.dataset.data_dir=$TFDS_DATA_DIR \
      --config.train.shifts.data_dir=/path/to/CIFAR-100-C

The whole grid (23 training methods, MC dropout among them, and
``ensemble(ce)``, a deep ensemble of 4 cross-entropy runs, x 16 calibrators x
3 seeds; the binary-only Platt
and Beta calibrators are skipped for K = 100) of WRN-28-10 runs with
the soft-calibration paper's recipe (200 epochs, SGD 0.1, L2 5e-4, batch 512):
78 trainings (23 x 3, and the cross-entropy runs of seeds 3-11 that the
ensembles of seeds 0-3, 4-7 and 8-11 add) of about 3 h each on 1xH100 (not
measured here).
OOD detection is scored against SVHN (``tfds build svhn_cropped
--file_format=array_record`` into the same TFDS data dir; docs/data.md).
Variants: ``:seeds=N``, ``:shifts=jax`` (JAX corruptions of the test split
instead of the published files), ``:runlocal`` (a few steps of a small CNN),
``:ood=`` (no OOD set) or ``:ood=<name>``.
"""

from calib_jax.configs import common


def get_config(arg=None):
    return common.cifar_benchmark("cifar100", "wrn28_10", arg)
