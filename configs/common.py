"""Shared config skeleton: every field the trainer reads, with its default.

Configs build on :func:`base` one level deep (``c = common.base(); c.loss = ...``)
and are loaded with ``lock_config=True``, so a misspelt ``--config.x=y`` is an
error rather than a silently ignored field. Loss terms are config fields
(:func:`loss`, :mod:`calib_jax.objectives`): ``--config.loss.<term>.<hp>=v``.

Importing this module imports no JAX, Flax, Optax or Orbax: building a config
(``get_config``) imports :mod:`calib_jax.losses` (JAX) only to read the
defaults of the loss functions' hyperparameters.
"""

from __future__ import annotations

import ml_collections

from calib_jax import objectives


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

    # dtype: computation dtype ('float32' | 'bfloat16' | 'float16'); parameters,
    # optimizer state, losses and metrics stay float32. dropout_rate: dropout
    # of the models that have it (calib_jax.models.DROPOUT_MODELS; 0 = none).
    c.model = ml_collections.ConfigDict(
        dict(
            name="mlp",
            dtype="float32",
            dropout_rate=0.0,
            kwargs=ml_collections.ConfigDict(),
        )
    )
    # MC dropout (Gal & Ghahramani 2016) at evaluation: num_samples > 0
    # dropout samples per row (a model with dropout_rate > 0), seeded by seed;
    # every reported metric and the exported logits are of the mean of the
    # samples' probabilities, and logits/*.npz also hold mutual_information.
    c.mc_dropout = ml_collections.ConfigDict(dict(num_samples=0, seed=0))
    c.dataset = ml_collections.ConfigDict(
        dict(
            name="digits",
            data_dir="",  # '' = the dataset's default location (TFDS_DATA_DIR for tfds)
            train_split="train",
            val_split="val",
            test_split="test",
        )
    )
    # Loss terms, summed in the order of loss.terms; each term's weight and
    # hyperparameters are fields (calib_jax.objectives), e.g.
    # --config.loss.cross_entropy.weight=0.5; a tuple of term dicts
    # (--config.loss="({'name': 'focal', 'gamma': 2.0},)") replaces them whole.
    c.loss = objectives.loss_field((dict(name="cross_entropy", weight=1.0),))

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

    # Input: every split is decoded once (TFDS records -> uint8 arrays), held
    # in host memory up to memory_gb in total and beyond that in memory-mapped
    # .npy caches under cache_dir ('' = <TFDS data dir>/calib_jax_cache).
    # Batches go to the devices as stored (uint8) and are converted there;
    # prefetch = batches gathered and placed on the mesh ahead of the step by a
    # background thread (0 = none). decode_workers = threads decoding a split
    # (0 = min(8, CPUs)).
    c.input = ml_collections.ConfigDict(
        {"prefetch": 2, "memory_gb": 4.0, "cache_dir": "", "decode_workers": 0}
    )

    c.log_every = 50
    # TensorBoard event files beside metrics.jsonl (tensorboardX, no
    # TensorFlow): scalars, per-shift metrics and reliability diagrams;
    # tensorboard_dir '' = <workdir>/tensorboard.
    c.log = ml_collections.ConfigDict({"tensorboard": False, "tensorboard_dir": ""})
    c.eval_every = 0  # 0 = only at the end
    c.checkpoint_every = 500
    # Seconds a checkpoint save may take in the background before the run
    # stops with an error naming it (storage that stalls); rerunning resumes.
    c.checkpoint_timeout_s = 1200
    # A run whose loss or parameters turn non-finite stops with an error and
    # keeps its good checkpoints. True re-runs the step that made a NaN
    # operation by operation and names the operation (slow; for debugging).
    c.debug_nans = False

    # Shifted test sets: 'all' (every available corruption: the 10 JAX ones,
    # or the 19 of a complete published set), 'standard15' (the 15 corruptions
    # papers average over; the 8 of them the JAX set implements), 'none' or a
    # comma-separated list of corruption names; severities in 1..5. With
    # dataset='' they are the JAX corruptions of the test split; with
    # dataset='cifar10_corrupted' (or 'cifar100_corrupted') the published files
    # of that dataset (its data_dir, or dataset.data_dir). See docs/data.md.
    c.shifts = ml_collections.ConfigDict(
        dict(corruptions="all", severities=(1, 2, 3, 4, 5), dataset="", data_dir="")
    )
    # Out-of-distribution set scored against the test split (ood/<metric>, the
    # maximum softmax probability): '' = none, a name of
    # calib_jax.data.OOD_SETS ('digits_patches', 'svhn_cropped') or of
    # DATASETS (read from `split`); data_dir '' = dataset.data_dir.
    c.ood = ml_collections.ConfigDict(dict(dataset="", data_dir="", split="test"))
    # Interleaved training (soft-calibration paper App. B).
    c.interleaved = ml_collections.ConfigDict(
        dict(
            enabled=False,
            holdout_fraction=0.1,
            secondary=objectives.loss_field(
                (dict(name="sb_ece", weight=1.0),), "interleaved.secondary"
            ),
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


def loss(*terms: dict, what: str = "loss") -> ml_collections.ConfigDict:
    """The config fields of loss ``terms`` (``dict(name=..., weight=1.0, **hp)``).

    Every hyperparameter of each term's loss is a field (defaults from the loss
    function), in the order given: :func:`calib_jax.objectives.loss_config`.
    """
    return objectives.loss_config(terms, what)


def choose(name: str, options: dict, what: str = "loss"):
    """``options[name]``, or a ValueError listing the valid choices."""
    if name not in options:
        raise ValueError(
            f"Unknown {what} '{name}'. Valid: {', '.join(sorted(options))}."
        )
    return options[name]


# Named training objectives (the loss terms of each method).
OBJECTIVES = objectives.OBJECTIVES

# The papers' CIFAR recipes: (epochs, global batch, schedule boundaries as
# epochs, decay factor). All use SGD, momentum 0.9, lr 0.1, L2 5e-4.
RECIPES = {
    # Soft-calibration paper, App. G: 200 epochs, 8 cores x 64 = 512; the
    # schedule is "fixed per dataset" but unstated: the WRN paper's x0.2 steps.
    "soft_calibration": (200, 512, (60, 120, 160), 0.2),
    # ACLS paper, Sec. 5: 350 epochs, batch 128, /10 at 150 and 250.
    "acls": (350, 128, (150, 250), 0.1),
    # Reweighted-risk paper, App. D.1: batch 128, x0.2 at 60/120/160; 200
    # epochs (CIFAR-10) or 250 (CIFAR-100).
    "reweighted_risk": (200, 128, (60, 120, 160), 0.2),
    # MaC-Cal, Sec. 5.1: 350 epochs, 0.1 -> 0.01 at 150 -> 0.001 at 250.
    "maccal": (350, 128, (150, 250), 0.1),
}


def cifar(
    dataset: str, model: str, recipe: str, objective: str
) -> ml_collections.ConfigDict:
    """A CIFAR-10/100 training config following one paper's recipe."""
    epochs, batch, bounds, factor = choose(recipe, RECIPES, "recipe")
    c = base()
    c.dataset.name = dataset
    c.dataset.val_split = "val"  # the last 5000 training images
    c.model.name = model
    c.loss = loss(*choose(objective, OBJECTIVES, "objective"))
    c.optimizer.name = "sgd"
    c.optimizer.learning_rate = 0.1
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 5e-4
    c.schedule.name = "piecewise"
    c.schedule.boundaries = tuple(b / epochs for b in bounds)
    c.schedule.decay_factor = factor
    c.batch_size = batch
    c.eval_batch_size = 1000
    c.num_epochs = float(epochs)
    c.augment = "crop_flip"
    c.log_every = 100
    c.eval_every = 5000
    c.checkpoint_every = 1000
    return c


def benchmark_base() -> ml_collections.ConfigDict:
    """Defaults of a benchmark config (``python -m calib_jax.benchmark``).

    ``train`` is the base training run every method modifies (``base()``);
    ``two_stage`` holds the training fields the MaC-Cal stage-II cell
    overrides (plain SGD, as ``configs/digits_two_stage.py``).
    """
    c = ml_collections.ConfigDict()
    c.train = base()
    # True: every cell's training run and the benchmark's results and figures
    # write TensorBoard event files (under each run's and the workdir's
    # tensorboard/).
    c.log = ml_collections.ConfigDict({"tensorboard": False})
    # Figures of report.md: `methods` are drawn in ece_vs_severity.png beside
    # the baseline and the best (every method: ece_vs_severity_all.png);
    # reliability bins with fewer than `min_count` samples are greyed out.
    c.report = ml_collections.ConfigDict({"methods": (), "min_count": 10})
    c.methods = ("ce",)
    c.calibrators = ("none", "ts:nll")
    c.seeds = (0, 1, 2)
    c.num_bins = 15
    # Per-cell percentile intervals of accuracy, ECE and NLL on the clean test
    # set (calib_jax.metrics.bootstrap; a fixed key per cell); 0 = none.
    c.bootstrap = ml_collections.ConfigDict(dict(num_samples=200, confidence=0.95))
    # Calibration tests of every result row (calib_jax.metrics): Spiegelhalter's
    # Z test on every set, and on the clean test set the consistency-resampling
    # p-value of the ECE (Broecker & Smith 2007; `num_samples` resamples, a fixed
    # key per cell; 0 = none) and the CORP decompositions.
    c.calibration_tests = ml_collections.ConfigDict(dict(num_samples=200))
    # Deep ensembles, method 'ensemble(<method>)': ensemble g = 0..num_groups-1
    # (its `seed` in the rows) averages the runs of <method> with seeds
    # g*size..(g+1)*size-1; member seeds outside `seeds` are trained for the
    # ensembles only when `extra_runs` (they give no rows of <method>).
    c.ensemble = ml_collections.ConfigDict(dict(size=3, num_groups=3, extra_runs=True))
    # Method 'mc_dropout': cross-entropy with this dropout rate, evaluated by
    # `num_samples` test-time dropout samples drawn from `seed`.
    c.mc_dropout = ml_collections.ConfigDict(
        dict(dropout_rate=0.1, num_samples=16, seed=0)
    )
    # Far-OOD set of the digits benchmark (no download; docs/data.md); the
    # CIFAR benchmarks use SVHN. '' = no OOD scores.
    c.train.ood.dataset = "digits_patches"
    c.two_stage = ml_collections.ConfigDict(
        dict(
            optimizer=dict(
                name="sgd",
                learning_rate=0.3,
                momentum=0.0,
                nesterov=False,
                weight_decay=0.0,
                decay="all",
            ),
            schedule=dict(
                name="constant",
                warmup_steps=0,
                boundaries=(0.5, 0.75),
                decay_factor=0.1,
            ),
            num_epochs=40.0,
            num_steps=0,
        )
    )
    return c


def cifar_benchmark(dataset: str, model: str, arg: str | None):
    """A benchmark config on CIFAR-10/100 with the published CIFAR-C shifts.

    The training recipe is the soft-calibration paper's (``cifar(...,
    'soft_calibration', ...)``); MaC-Cal stage II follows MaC-Cal Sec. 5.1
    ("the second stage adds 40 epochs at 0.1 LR", SGD with momentum 0.9 and
    weight decay 5e-4; the 5-epoch stage of its Sec. 4.1 is a pilot study). ``shifts=jax`` uses the JAX corruptions of the test
    split instead of the published ``<dataset>_corrupted`` files;
    ``runlocal`` shrinks every run to a few steps of a small CNN; ``ood=``
    names the OOD set (default ``svhn_cropped``; empty: none).
    """
    from calib_jax.benchmark import grid  # noqa: PLC0415 - configs stay light

    a = parse_arg(arg, seeds=3, shifts="published", runlocal=False, ood="svhn_cropped")
    c = benchmark_base()
    c.train = cifar(dataset, model, "soft_calibration", "ce")
    c.train.ood.dataset = a.ood  # SVHN's TFDS build in dataset.data_dir
    if a.shifts == "published":
        c.train.shifts.dataset = f"{dataset}_corrupted"
    elif a.shifts != "jax":
        raise ValueError(f"shifts must be 'published' or 'jax', got '{a.shifts}'.")
    c.methods = (*grid.METHODS, grid.ensemble_name("ce"))
    c.calibrators = grid.CALIBRATORS
    c.seeds = tuple(range(a.seeds))
    # Deep ensembles of 4 (uncertainty-baselines' CIFAR ensemble), one per
    # seed; MC dropout at the WRN paper's rate (Zagoruyko & Komodakis 2016).
    c.ensemble.size = 4
    c.ensemble.num_groups = len(c.seeds)
    c.mc_dropout.dropout_rate = 0.3
    # MaC-Cal Sec. 5.1: stage II is 40 epochs at lr 0.1, momentum 0.9, L2 5e-4.
    c.two_stage.optimizer.learning_rate = 0.1
    c.two_stage.optimizer.momentum = 0.9
    c.two_stage.optimizer.weight_decay = 5e-4
    c.two_stage.num_epochs = 40.0
    if a.runlocal:
        c.train.model.name = "cnn"
        c.train.num_steps, c.train.batch_size, c.train.eval_batch_size = 2, 16, 16
        c.two_stage.num_steps = 2
    return c
