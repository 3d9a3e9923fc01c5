"""Evaluate a trained run without retraining: checkpoint or exported logits in.

``python -m calib_jax.evaluate --config CFG --workdir RUN [--out DIR]
[--from_logits] [--overwrite] [--mc_dropout_samples=N] [--mc_dropout_seed=S]
[--config.x=y ...]`` restores RUN's newest
checkpoint that restores with CFG (read only) and scores it on the
validation and test splits, every shifted test set of ``config.shifts`` and
the OOD set of ``config.ood``, with the trainer's own evaluation
(:mod:`calib_jax.train.evaluate`): the metrics equal the trainer's end-of-run
metrics bit for bit for the same config. ``--from_logits`` scores the logits
RUN exported instead. ``--mc_dropout_samples=N`` scores the checkpoint by MC
dropout (the mean of N dropout samples per row) and writes each set's
``mutual_information`` beside its logits. Outputs go to ``DIR`` (default
``RUN/evaluate``): ``metrics.jsonl``, ``metrics.json``, ``logits/`` and
``plots/``.
"""

from calib_jax.evaluate._run import OUT_DIRNAME, OUTPUTS, run

__all__ = ["OUTPUTS", "OUT_DIRNAME", "run"]
