"""Shared config skeleton: every field the trainer reads, with its default.

Configs build on :func:`base` one level deep (``c = common.base(); c.loss = ...``)
and are loaded with ``lock_config=True``, so a misspelt ``--config.x=y`` is an
error rather than a silently ignored field.
"""

from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """Parses ``'a=1,b=x,flag'`` into a ConfigDict typed like ``defaults``.

    Unknown keys raise ValueError; a bare key sets a bool default to True.
    """
    out = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, _, value = item.partition("=")
        if key not in defaults:
            raise ValueError(
                f"Unknown config argument '{key}'. Valid: {', '.join(sorted(defaults))}."
            )
        kind = type(defaults[key])
        if kind is bool:
            out[key] = value.lower() not in ("0", "false", "no") if value else True
        else:
            out[key] = kind(value)
    return out


def base() -> ml_collections.ConfigDict:
    """Defaults: MLP on digits, cross-entropy, AdamW with cosine decay."""
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.model = ml_collections.ConfigDict(
        dict(name="mlp", kwargs=ml_collections.ConfigDict())
    )
    c.dataset = ml_collections.ConfigDict(
        dict(
            name="digits",
            data_dir="",  # '' = the dataset's default location (TFDS_DATA_DIR for tfds)
            train_split="train",
            val_split="val",
            test_split="test",
        )
    )
    # Loss terms: [{name, weight, **hparams}] -> calib_jax.losses.composite.
    c.loss = (dict(name="cross_entropy", weight=1.0),)

    c.optimizer = ml_collections.ConfigDict(
        dict(
            name="adamw",  # 'sgd' | 'adamw'
            learning_rate=3e-3,
            momentum=0.9,  # sgd only
            nesterov=False,  # sgd only
            weight_decay=1e-4,  # L2 for sgd (coupled, PyTorch style), decoupled for adamw
            decay="all",  # 'all' parameters (the papers' PyTorch code) | 'kernels'
        )
    )
    c.schedule = ml_collections.ConfigDict(
        dict(
            name="cosine",  # 'constant' | 'cosine' | 'piecewise'
            warmup_steps=0,
            boundaries=(0.5, 0.75),  # piecewise: fractions of training
            decay_factor=0.1,  # piecewise: multiplier at each boundary
        )
    )
    c.batch_size = 128
    c.eval_batch_size = 512
    c.num_steps = 0  # > 0 wins over num_epochs
    c.num_epochs = 60.0
    c.augment = ""  # '' | 'crop_flip' (CIFAR)
    # 'global': batch-level terms see the whole global batch under sharded jit;
    # 'per_device': each device's shard, averaged (the papers' per-core numbers).
    c.calibration_stats = "global"

    c.log_every = 50
    c.eval_every = 0  # 0 = only at the end
    c.checkpoint_every = 500

    # Shifted test sets: JAX corruptions of the test split: 'all', 'none' or a
    # comma-separated list of names; severities in 1..5.
    c.shifts = ml_collections.ConfigDict(
        dict(corruptions="all", severities=(1, 2, 3, 4, 5))
    )
    # Interleaved training (soft-calibration paper App. B).
    c.interleaved = ml_collections.ConfigDict(
        dict(
            enabled=False,
            holdout_fraction=0.1,
            secondary=(dict(name="sb_ece", weight=1.0),),
        )
    )
    # MaC-Cal stage II (masked retraining of a new head on frozen features).
    c.two_stage = ml_collections.ConfigDict(
        dict(
            enabled=False,
            stage1_workdir="",
            bottleneck_width=128,
            q0=0.5,
            eta_init=0.1,
            eta_final=0.001,
            gamma=0.9,
            mask_every="epoch",  # 'epoch' (Eq. 8) | 'step' (Algorithm 1, line 4)
        )
    )
    return c


def choose(name: str, options: dict, what: str = "loss"):
    """``options[name]``, or a ValueError listing the valid choices."""
    if name not in options:
        raise ValueError(
            f"Unknown {what} '{name}'. Valid: {', '.join(sorted(options))}."
        )
    return options[name]
