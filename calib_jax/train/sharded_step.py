"""The trainer's jitted, sharded steps, built from the config and dataset metadata.

This is the one jit site of the train step: :func:`calib_jax.train.setup.build`
runs it on real batches, and ``benchmarks/tpu_aot.py`` lowers the very same
``jax.jit`` object ahead of time for TPU topologies from
:attr:`ShardedStep.abstract_state` and :attr:`ShardedStep.abstract_batch`,
reading no data. Nothing here opens a dataset file: the dataset enters only
through its metadata (``num_classes``, ``image_shape``, ``mean``, ``std``; a
:class:`calib_jax.data.DatasetInfo` or a :class:`calib_jax.data.Dataset`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from calib_jax import losses, models, objectives
from calib_jax.data import augment as augment_lib
from calib_jax.train import cli, optim
from calib_jax.train import mesh as mesh_lib
from calib_jax.train import step as step_lib
from calib_jax.train.state import TrainState, create

AUGMENTATIONS = ("", "crop_flip")


@dataclasses.dataclass
class ShardedStep:
    """The jitted steps of a run and the abstract arguments they compile for.

    Attributes:
      train: ``jax.jit`` of ``train_step(state, batch) -> (state, metrics)``
        for ``config.loss``, with the state replicated, the batch split over
        ``"data"`` and the state donated.
      secondary: the same for ``config.interleaved.secondary``, or ``None``.
      eval: ``jax.jit`` of ``eval_step(state, images) -> logits``.
      init_state: ``() -> TrainState``, the initial state placed on the mesh.
      abstract_state: the state as ``jax.ShapeDtypeStruct`` leaves with their
        shardings.
      abstract_batch: ``{'image', 'label', 'mask'}`` of the global batch
        (``config.batch_size`` rows) as ``jax.ShapeDtypeStruct`` with the
        batch sharding.
      state_sharding: the state's sharding pytree.
      batch_sharding: the batch's ``NamedSharding``.
      replicated: the replicated ``NamedSharding`` of the mesh.
      schedule: the learning-rate schedule over ``num_steps``.
    """

    train: Any
    secondary: Any
    eval: Any
    init_state: Callable[[], TrainState]
    abstract_state: TrainState
    abstract_batch: dict[str, jax.ShapeDtypeStruct]
    state_sharding: Any
    batch_sharding: NamedSharding
    replicated: NamedSharding
    schedule: optax.Schedule


def make_model(config: ConfigDict, num_classes: int):
    """The flax model of ``config.model`` with ``num_classes`` logits.

    Raises:
      ValueError: an unknown model name or dtype, or a misspelt
        ``config.model.kwargs`` (the model's options are listed).
    """
    try:
        return models.from_config(config.model, num_classes=num_classes)
    except ValueError as e:
        if not (
            str(e).startswith("config.model.kwargs:")
            and config.model.name in models.MODELS
        ):
            raise
        options = cli.model_options(config.model.name)
        raise ValueError(
            f"{str(e).rstrip('.')}; the options of model '{config.model.name}' "
            f"are: {', '.join(options)}."
        ) from None


def make_objective(config: ConfigDict, what: str = "loss"):
    """The composite objective of ``config.<what>`` (``'loss'`` or
    ``'interleaved.secondary'``), in either form of :mod:`calib_jax.objectives`.

    Returns:
      ``objective(logits, labels, where=None) -> (total, logs)``
      (:func:`calib_jax.losses.composite`).

    Raises:
      ValueError: as :func:`calib_jax.objectives.loss_terms` and
        :func:`calib_jax.losses.composite` (an unknown loss or
        hyperparameter, a value outside its domain).
    """
    field = config
    for key in what.split("."):
        field = field[key]
    return losses.composite(objectives.loss_terms(field, what))


def make_augment(config: ConfigDict):
    """The on-device augmentation ``(images, rng) -> images`` of ``config.augment``.

    Returns:
      ``None`` for ``''``.

    Raises:
      ValueError: ``config.augment`` not in :data:`AUGMENTATIONS`.
    """
    if config.augment == "crop_flip":
        # uint8 batches become float32 in [0, 1] on device before the crop.
        return lambda x, r: augment_lib.random_crop_flip(augment_lib.to_float(x), r)
    if config.augment:
        raise ValueError(
            f"Unknown config.augment '{config.augment}'; use '' or 'crop_flip'."
        )
    return None


def preprocess(info, images: jax.Array) -> jax.Array:
    """The model input: ``images`` standardised with the dataset's mean and std.

    uint8 batches (as the host pipeline places them) are converted to float32
    in ``[0, 1]`` here, on the device (:func:`calib_jax.data.augment.to_float`).
    """
    images = augment_lib.to_float(images)
    return augment_lib.normalize(images, info.mean, info.std)


def abstract_batch(
    batch_size: int,
    image_shape: tuple[int, ...],
    sharding: NamedSharding,
    image_dtype: str = "uint8",
) -> dict[str, jax.ShapeDtypeStruct]:
    """The global train batch as ``jax.ShapeDtypeStruct`` leaves with ``sharding``.

    Args:
      batch_size: global batch size (rows over all devices).
      image_shape: ``(H, W, C)``.
      sharding: the batch sharding (leading axis over ``"data"``).
      image_dtype: dtype of ``batch['image']`` as the host pipeline places it
        on the device (the dataset's ``image_dtype``: ``'uint8'`` for CIFAR,
        ``'float32'`` for digits).

    Returns:
      ``{'image': image_dtype [B, H, W, C], 'label': int32 [B],
      'mask': bool [B]}``.
    """

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct((batch_size, *shape), dtype, sharding=sharding)

    return {
        "image": spec(tuple(image_shape), jnp.dtype(image_dtype)),
        "label": spec((), jnp.int32),
        "mask": spec((), jnp.bool_),
    }


def build_sharded_step(
    config: ConfigDict,
    info,
    mesh: Mesh,
    num_steps: int,
    *,
    model=None,
    stage=None,
    steps_per_epoch: int = 1,
) -> ShardedStep:
    """Builds the run's jitted train and eval steps on ``mesh`` (no data read).

    Args:
      config: a trainer config (``configs/*.py``), already validated.
      info: the dataset's metadata: ``num_classes``, ``image_shape``, ``mean``
        and ``std`` (:func:`calib_jax.data.dataset_info` or a ``Dataset``).
      mesh: a one-axis ``"data"`` mesh; its devices may be those of a TPU
        topology description (ahead-of-time compilation).
      num_steps: the number of updates (the schedule's length).
      model: the model; default :func:`make_model` of ``config``.
      stage: a :class:`calib_jax.train.two_stage.StageTwo` for MaC-Cal stage
        II, else ``None``.
      steps_per_epoch: updates per epoch (stage II's mask period and ``q``
        update); unused otherwise.

    Returns:
      A :class:`ShardedStep`.

    Raises:
      ValueError: as :func:`make_model`, :func:`make_augment` and
        :func:`make_objective`.
    """
    primary = make_objective(config, "loss")
    secondary = (
        make_objective(config, "interleaved.secondary")
        if config.interleaved.enabled
        else None
    )
    augment = make_augment(config)
    if stage is not None:
        forward = stage.make_forward(steps_per_epoch)
    else:
        model = make_model(config, info.num_classes) if model is None else model
        forward = step_lib.model_forward(model)
    tx = optim.make_optimizer(config, num_steps)
    schedule = optim.make_schedule(config, num_steps)
    sample = jnp.zeros((1, *info.image_shape), jnp.float32)
    repl, rows = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)

    def init_fn(rng):
        if stage is not None:
            return stage.init_state(tx, rng)
        return create(model, tx, rng, preprocess(info, sample))

    rng = jax.random.key(config.seed)
    abstract = jax.eval_shape(init_fn, rng)
    state_sharding = jax.tree.map(lambda _: repl, abstract)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract,
        state_sharding,
    )

    def init_state():
        return jax.jit(init_fn, out_shardings=state_sharding)(rng)

    def wrap(loss):
        if config.calibration_stats == "per_device":
            return step_lib.per_device(loss, mesh)
        return loss

    def fwd(state, params, images, rng_, train):
        return forward(state, params, preprocess(info, images), rng_, train)

    hooks = stage.hooks(steps_per_epoch, num_steps) if stage is not None else {}

    def jit_step(loss):
        return jax.jit(
            step_lib.make_train_step(fwd, wrap(loss), tx, augment=augment, **hooks),
            in_shardings=(state_sharding, rows),
            out_shardings=(state_sharding, repl),
            donate_argnums=0,
        )

    eval_step = jax.jit(
        step_lib.make_eval_step(fwd),
        in_shardings=(state_sharding, rows),
        out_shardings=rows,
    )
    return ShardedStep(
        train=jit_step(primary),
        secondary=jit_step(secondary) if secondary is not None else None,
        eval=eval_step,
        init_state=init_state,
        abstract_state=abstract,
        abstract_batch=abstract_batch(
            config.batch_size, info.image_shape, rows, info.image_dtype
        ),
        state_sharding=state_sharding,
        batch_sharding=rows,
        replicated=repl,
        schedule=schedule,
    )
