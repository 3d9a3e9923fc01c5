"""``python -m calib_jax.evaluate --config CFG --workdir RUN [--out DIR]``.

Scores a training run on clean data, shifted sets and the OOD set without
retraining: from its newest checkpoint that restores with ``--config``, or
from its exported logits (``--from_logits``). ``--config.x=y`` overrides
change what is evaluated, e.g. ``--config.shifts.dataset=cifar10_corrupted
--config.shifts.data_dir=/data/CIFAR-10-C --config.shifts.corruptions=standard15``.
``--mc_dropout_samples=N [--mc_dropout_seed=S]`` evaluates the checkpoint by
MC dropout (the mean of N test-time dropout samples per row; the model needs
``config.model.dropout_rate > 0``) and adds each set's ``mutual_information``.
Writes under ``--out`` (default ``RUN/evaluate``) and never replaces an
earlier evaluation without ``--overwrite``. User errors (a workdir with
neither checkpoints nor logits, a config of another model, a bad name or
missing data, a truncated logits file) print one line on stderr and exit with
status 2; Ctrl-C prints ``interrupted`` and exits with status 130.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from calib_jax import _cli
from calib_jax.train import distributed  # defines the multi-host flags
from calib_jax.train.cli import load_config, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "The run's config file (optionally ':arg'); --config.x=y overrides.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The training run: its checkpoints, or its logits."
)
_OUT = flags.DEFINE_string(
    "out", None, "Output directory (default: <workdir>/evaluate)."
)
_FROM_LOGITS = flags.DEFINE_bool(
    "from_logits", False, "Score the run's exported logits; no checkpoint needed."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace an earlier evaluation in --out."
)
_MC_SAMPLES = flags.DEFINE_integer(
    "mc_dropout_samples",
    None,
    "MC dropout: test-time dropout samples per row (config.mc_dropout."
    "num_samples; default: the config's, 0 = off). Needs a model with dropout.",
)
_MC_SEED = flags.DEFINE_integer(
    "mc_dropout_seed",
    None,
    "Seed of the MC-dropout samples (config.mc_dropout.seed; default: the config's).",
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    config = load_config(_CONFIG)
    _cli.finish(_cli.run_main(lambda: _evaluate(config)))


def _evaluate(config) -> None:
    from calib_jax.evaluate._run import run  # after flag parsing

    distributed.initialize_from_flags()  # before any JAX computation
    results, out = run(
        config,
        _WORKDIR.value,
        out=_OUT.value,
        from_logits=_FROM_LOGITS.value,
        overwrite=_OVERWRITE.value,
        mc_dropout_samples=_MC_SAMPLES.value,
        mc_dropout_seed=_MC_SEED.value,
    )
    import jax  # already imported by the run

    if jax.process_index() != 0:
        return
    shown = sorted(
        k for k in results if k.count("/") == 1 or k.startswith("shift/mean/")
    )
    for key in shown:
        print(f"{key:28s} {results[key]:.4f}")
    print(f"written to {out}")


def run():
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
