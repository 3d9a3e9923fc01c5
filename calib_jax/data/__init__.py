"""Datasets, host pipeline, on-device augmentation and corruptions.

``get_dataset(name, data_dir=...)`` returns a :class:`Dataset` whose
``source(split)`` is a random-access source; ``get_ood_set(name)`` an
out-of-distribution set scored against a model's test split; :mod:`calib_jax.data.cache`
decodes a split once into arrays; :mod:`calib_jax.data.pipeline` turns sources
into training and eval batches; :mod:`calib_jax.data.prefetch` makes the next
ones on a thread; :mod:`calib_jax.data.schedule` maps training steps to batches
(plain or interleaved epochs); :mod:`calib_jax.data.augment` and
:mod:`calib_jax.data.corruptions` run on device.
"""

from calib_jax.data import (
    augment,
    cache,
    corruptions,
    pipeline,
    prefetch,
    schedule,
)
from calib_jax.data._datasets import (
    CORRUPTION_ALIASES,
    CORRUPTION_PRESETS,
    DATASETS,
    EXTRA4,
    INFO,
    STANDARD15,
    Dataset,
    DatasetInfo,
    dataset_info,
    get_dataset,
)
from calib_jax.data._digits import load_digits
from calib_jax.data._ood import OOD_SETS, OodSet, get_ood_set
from calib_jax.data._sources import (
    ArraySource,
    NpySource,
    Source,
    SubsetSource,
    TfdsSource,
)

__all__ = [
    "CORRUPTION_ALIASES",
    "CORRUPTION_PRESETS",
    "DATASETS",
    "EXTRA4",
    "INFO",
    "OOD_SETS",
    "STANDARD15",
    "ArraySource",
    "Dataset",
    "DatasetInfo",
    "NpySource",
    "OodSet",
    "Source",
    "SubsetSource",
    "TfdsSource",
    "augment",
    "cache",
    "corruptions",
    "dataset_info",
    "get_dataset",
    "get_ood_set",
    "load_digits",
    "pipeline",
    "prefetch",
    "schedule",
]
