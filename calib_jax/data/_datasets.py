"""The ``DATASETS`` registry: digits, CIFAR-10/100 and the published CIFAR-C sets.

CIFAR comes from a TFDS data dir through ``tfds.data_source`` (array_record
files, no TensorFlow at run time); CIFAR-10-C from the published directory of
``.npy`` files or a TFDS build; CIFAR-100-C from the published ``.npy``
directory. See ``docs/data.md`` for the one-time preparation.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from etils import epath

from calib_jax import storage
from calib_jax.data import _digits, corruptions
from calib_jax.data._sources import ArraySource, NpySource, Source, TfdsSource

# Corruptions of the published CIFAR-10-C / CIFAR-100-C sets (TFDS names; the
# .npy release calls frosted_glass_blur "glass_blur" and elastic
# "elastic_transform").
PUBLISHED_CORRUPTIONS = (
    "brightness",
    "contrast",
    "defocus_blur",
    "elastic",
    "elastic_transform",
    "fog",
    "frost",
    "frosted_glass_blur",
    "gaussian_blur",
    "gaussian_noise",
    "glass_blur",
    "impulse_noise",
    "jpeg_compression",
    "motion_blur",
    "pixelate",
    "saturate",
    "shot_noise",
    "snow",
    "spatter",
    "speckle_noise",
    "zoom_blur",
)
# The 15 corruptions of [1] whose mean the papers report (release names; the
# TFDS build names glass_blur "frosted_glass_blur" and elastic_transform
# "elastic"), then the 4 held-out extras of the release: 19 in all.
#   [1] D. Hendrycks, T. Dietterich, "Benchmarking Neural Network Robustness to
#       Common Corruptions and Perturbations", ICLR 2019, arXiv:1903.12261v1.
STANDARD15 = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
EXTRA4 = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
# Other names of a standard corruption: the TFDS build's, then the JAX
# corruption that stands in for it (calib_jax.data.corruptions).
CORRUPTION_ALIASES = {
    "glass_blur": ("frosted_glass_blur",),
    "elastic_transform": ("elastic",),
    "jpeg_compression": ("jpeg_like",),
}
# Values of config.shifts.corruptions that name a set (documented in docs/data.md).
CORRUPTION_PRESETS = ("all", "standard15")
_JAX_SHIFTS = tuple((c, s) for c in corruptions.CORRUPTIONS for s in (1, 2, 3, 4, 5))

# Per-channel mean and std of the training images in [0, 1].
_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
_CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
_DIGITS_STATS = ((0.3048,), (0.3758,))  # of the 1077-image train split
_CIFAR_TRAIN_SIZE = 50_000


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model and a train step need of a dataset, known without its files.

    Attributes:
      name: registry name.
      num_classes: K.
      image_shape: ``(H, W, C)`` (the published layout; a CIFAR-100-C
        directory's own files may differ, and its :class:`Dataset` says so).
      mean: per-channel mean of the training images in ``[0, 1]``.
      std: per-channel standard deviation, likewise.
      image_dtype: dtype of the decoded images, which the host pipeline places
        on the device as they are (``'uint8'``, converted there; digits are
        ``'float32'`` in ``[0, 1]``).
    """

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_dtype: str = "uint8"


INFO: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(
        "digits", _digits.NUM_CLASSES, (8, 8, 1), *_DIGITS_STATS, "float32"
    ),
    "cifar10": DatasetInfo("cifar10", 10, (32, 32, 3), *_CIFAR10_STATS),
    "cifar100": DatasetInfo("cifar100", 100, (32, 32, 3), *_CIFAR100_STATS),
    "cifar10_corrupted": DatasetInfo(
        "cifar10_corrupted", 10, (32, 32, 3), *_CIFAR10_STATS
    ),
    "cifar100_corrupted": DatasetInfo(
        "cifar100_corrupted", 100, (32, 32, 3), *_CIFAR100_STATS
    ),
}


def dataset_info(name: str) -> DatasetInfo:
    """The metadata of the registered dataset ``name``, opening no file.

    Raises:
      ValueError: unknown ``name`` (the valid names are listed).
    """
    if name not in INFO:
        raise ValueError(
            f"Unknown dataset '{name}'. Valid datasets: {', '.join(INFO)}."
        )
    return INFO[name]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A named image-classification dataset.

    Attributes:
      name: registry name.
      num_classes: K.
      image_shape: ``(H, W, C)``.
      splits: names accepted by :meth:`source`.
      mean: per-channel mean of the training images in ``[0, 1]`` (for
        :func:`calib_jax.data.augment.normalize`).
      std: per-channel standard deviation, likewise.
      open_split: ``split -> Source``; use :meth:`source`, which validates.
      available_shifts: what :meth:`shifts` returns.
      image_dtype: dtype of the decoded images (``'uint8'``; digits
        ``'float32'``), placed on the device as they are.
    """

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]
    splits: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    open_split: Callable[[str], Source] = dataclasses.field(repr=False, compare=False)
    available_shifts: tuple[tuple[str, int], ...] = dataclasses.field(
        default=(), repr=False
    )
    image_dtype: str = "uint8"

    def source(self, split: str) -> Source:
        """The random-access source of ``split``.

        Returns:
          ``len(src)`` and ``src[i] -> {'image': uint8 or float32 [H, W, C],
          'label': int}``.

        Raises:
          ValueError: unknown split.
        """
        if split not in self.splits:
            raise ValueError(
                f"Unknown split '{split}' of {self.name}. Valid splits: "
                f"{', '.join(self.splits)}."
            )
        return self.open_split(split)

    def shifts(self) -> list[tuple[str, int]]:
        """The ``(corruption, severity)`` shifts available for this dataset.

        For clean datasets (``digits``, ``cifar10``, ``cifar100``): every JAX
        corruption of :mod:`calib_jax.data.corruptions` at severities 1-5,
        applied on device to the test split. For the published sets
        (``cifar10_corrupted``, ``cifar100_corrupted``): the corruption files
        present in the data dir, each read with ``source(f'{c}_{s}')``.
        """
        return list(self.available_shifts)


# ---- digits -----------------------------------------------------------------------


def _digits_dataset(*, data_dir: str | None = None) -> Dataset:
    del data_dir  # Embedded in scikit-learn; nothing to locate.

    def open_split(split: str) -> Source:
        arrays = _digits.load_digits(split)
        return ArraySource(arrays["image"], arrays["label"])

    info = INFO["digits"]
    return Dataset(
        name=info.name,
        num_classes=info.num_classes,
        image_shape=info.image_shape,
        splits=_digits.SPLITS,
        mean=info.mean,
        std=info.std,
        image_dtype=info.image_dtype,
        open_split=open_split,
        available_shifts=_JAX_SHIFTS,
    )


# ---- TFDS CIFAR ---------------------------------------------------------------------


def _tfds_dir(data_dir: str | None) -> str:
    if data_dir:
        return os.fspath(data_dir)
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser(
        "~/tensorflow_datasets"
    )


def _build_hint(name: str, data_dir: str | None) -> str:
    where = _tfds_dir(data_dir)
    return (
        f"Build it once, on any machine with TensorFlow installed (only this step "
        f"needs it):\n"
        f"  pip install tensorflow tensorflow-datasets\n"
        f"  tfds build {name} --file_format=array_record --data_dir {where}\n"
        f"then pass data_dir='{where}' (trainer: --config.dataset.data_dir={where}). "
        "See docs/data.md."
    )


class _NoVariantFolderNotice(logging.Filter):
    """Drops tfds's warnings about incomplete build folders (the error names them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Variant folder ")


def open_tfds(name: str, split: str, data_dir: str | None) -> Source:
    """The :class:`Source` of a prepared TFDS split (instructions if absent)."""
    import tensorflow_datasets as tfds  # ~0.5 s; only CIFAR needs it

    quiet = _NoVariantFolderNotice()
    logger = logging.getLogger("absl")  # tfds logs through absl
    logger.addFilter(quiet)
    try:
        source = tfds.data_source(
            name, split=split, data_dir=_tfds_dir(data_dir), download=False
        )
    except (NotImplementedError, FileNotFoundError, AssertionError, OSError) as err:
        raise ValueError(
            f"No array_record build of TFDS '{name}' (split '{split}') found under "
            f"{_tfds_dir(data_dir)} (tfds raised {type(err).__name__}).\n"
            + _build_hint(name.split("/")[0], data_dir)
        ) from err
    finally:
        logger.removeFilter(quiet)
    return TfdsSource(source, data_dir=_tfds_dir(data_dir))


def _cifar_dataset(info: DatasetInfo, data_dir: str | None, val_size: int) -> Dataset:
    if not 0 <= val_size < _CIFAR_TRAIN_SIZE:
        raise ValueError(
            f"val_size must be in [0, {_CIFAR_TRAIN_SIZE}), got {val_size}."
        )
    n_train = _CIFAR_TRAIN_SIZE - val_size
    tfds_splits = {"train": f"train[:{n_train}]" if val_size else "train"}
    if val_size:
        tfds_splits["val"] = f"train[{n_train}:]"
    tfds_splits.update(test="test", train_full="train")
    name = info.name
    open_tfds(name, "test", data_dir)  # fail now, with instructions, if absent

    return Dataset(
        name=name,
        num_classes=info.num_classes,
        image_shape=info.image_shape,
        splits=tuple(tfds_splits),
        mean=info.mean,
        std=info.std,
        image_dtype=info.image_dtype,
        open_split=lambda split: open_tfds(name, tfds_splits[split], data_dir),
        available_shifts=_JAX_SHIFTS,
    )


def _cifar10_dataset(*, data_dir: str | None = None, val_size: int = 5000) -> Dataset:
    return _cifar_dataset(INFO["cifar10"], data_dir, val_size)


def _cifar100_dataset(*, data_dir: str | None = None, val_size: int = 5000) -> Dataset:
    return _cifar_dataset(INFO["cifar100"], data_dir, val_size)


def _parse_shift(config: str) -> tuple[str, int] | None:
    corruption, _, severity = config.rpartition("_")
    if corruption in PUBLISHED_CORRUPTIONS and severity in ("1", "2", "3", "4", "5"):
        return corruption, int(severity)
    return None


def _cifar10_corrupted_dataset(*, data_dir: str | None = None) -> Dataset:
    """CIFAR-10-C from the published ``.npy`` directory or from a TFDS build.

    A ``data_dir`` holding ``labels.npy`` is the published release directory
    (read as CIFAR-100-C's); any other is a TFDS data dir with
    ``cifar10_corrupted/<corruption>_<severity>`` configs.
    """
    given = storage.as_path(data_dir, what="data_dir") if data_dir else None
    if given is not None and (given / "labels.npy").exists():
        return _npy_corrupted_dataset(INFO["cifar10_corrupted"], given, "CIFAR-10-C")
    root = storage.as_path(_tfds_dir(data_dir), what="data_dir") / "cifar10_corrupted"
    configs = []
    if root.is_dir():
        for child in root.iterdir():
            if _parse_shift(child.name) and child.is_dir() and any(child.iterdir()):
                configs.append(child.name)
    if not configs:
        raise ValueError(
            f"No CIFAR-10-C configs under {root}, and no published CIFAR-10-C "
            f"directory (<corruption>.npy files and labels.npy) at "
            f"{data_dir or _tfds_dir(data_dir)}. Pass data_dir=<the extracted "
            "CIFAR-10-C.tar of https://zenodo.org/records/2535967>, or "
            + _build_hint("cifar10_corrupted", data_dir)
            + " (Builds all 19 corruptions x 5 severities, downloading ~2.9 GB; "
            "'tfds build cifar10_corrupted/gaussian_noise_3 ...' builds one.)"
        )
    shifts = sorted(_parse_shift(c) for c in configs)
    info = INFO["cifar10_corrupted"]
    return Dataset(
        name=info.name,
        num_classes=info.num_classes,
        image_shape=info.image_shape,
        splits=tuple(f"{c}_{s}" for c, s in shifts),
        mean=info.mean,
        std=info.std,
        image_dtype=info.image_dtype,
        open_split=lambda split: open_tfds(
            f"cifar10_corrupted/{split}", "test", data_dir
        ),
        available_shifts=tuple(shifts),
    )


# ---- CIFAR-100-C (.npy directory) ----------------------------------------------------


# The published releases (Hendrycks & Dietterich 2019), extracted.
_RELEASES = {
    "CIFAR-10-C": "https://zenodo.org/records/2535967",
    "CIFAR-100-C": "https://zenodo.org/records/3555552",
}


def _npy_corrupted_dataset(
    info: DatasetInfo, root: epath.Path | None, title: str
) -> Dataset:
    """A published CIFAR-C ``.npy`` directory (CIFAR-10-C and CIFAR-100-C alike),
    ``root`` as parsed from ``data_dir`` (None: not given)."""
    layout = (
        f"Expected the published {title} directory (Hendrycks & Dietterich 2019; "
        f"{title}.tar from {_RELEASES[title]}, extracted): one "
        "<corruption>.npy of shape [50000, 32, 32, 3] uint8 per corruption, the five "
        "severities stacked in order (10000 images each), plus labels.npy. Pass "
        "data_dir=<that directory>."
    )
    if root is None:
        raise ValueError(f"{info.name} needs data_dir. " + layout)
    labels_path = root / "labels.npy"
    files = sorted(p for p in root.glob("*.npy") if p.name != "labels.npy")
    if not root.is_dir() or not labels_path.exists() or not files:
        raise ValueError(f"No {title} files in {root}. " + layout)
    num_labels = storage.read_npy_header(labels_path).shape[0]
    shapes = {}
    for path in files:  # headers only: nothing else is read until a split opens
        shape = storage.read_npy_header(path).shape
        if (
            len(shape) != 4
            or shape[0] % 5
            or num_labels not in (shape[0], shape[0] // 5)
        ):
            raise ValueError(
                f"{path} has shape {shape} with {num_labels} labels. " + layout
            )
        shapes[path.stem] = tuple(shape[1:])
    if len(set(shapes.values())) != 1:
        raise ValueError(f"Image shapes differ between files in {root}: {shapes}.")
    shifts = tuple((p.stem, s) for p in files for s in (1, 2, 3, 4, 5))

    def open_split(split: str) -> Source:
        corruption, _, severity = split.rpartition("_")
        return NpySource(root / f"{corruption}.npy", labels_path, int(severity))

    return Dataset(
        name=info.name,
        num_classes=info.num_classes,
        image_shape=next(iter(shapes.values())),
        splits=tuple(f"{c}_{s}" for c, s in shifts),
        mean=info.mean,
        std=info.std,
        image_dtype=info.image_dtype,
        open_split=open_split,
        available_shifts=shifts,
    )


def _cifar100_corrupted_dataset(*, data_dir: str | None = None) -> Dataset:
    root = storage.as_path(data_dir, what="data_dir") if data_dir else None
    return _npy_corrupted_dataset(INFO["cifar100_corrupted"], root, "CIFAR-100-C")


DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": _digits_dataset,
    "cifar10": _cifar10_dataset,
    "cifar100": _cifar100_dataset,
    "cifar10_corrupted": _cifar10_corrupted_dataset,
    "cifar100_corrupted": _cifar100_corrupted_dataset,
}


def get_dataset(name: str, *, data_dir: str | None = None, **kwargs) -> Dataset:
    """Returns the registered dataset ``name``, checking that its files exist.

    Args:
      name: a key of :data:`DATASETS`.
      data_dir: the TFDS data dir (``cifar10``, ``cifar100``; default
        ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), the published
        ``.npy`` directory (``cifar100_corrupted``, required;
        ``cifar10_corrupted`` when it holds ``labels.npy``, else a TFDS data
        dir with ``cifar10_corrupted`` configs). Ignored by ``digits``.
      **kwargs: dataset options; CIFAR-10/100 take ``val_size`` (default 5000:
        ``train`` is the first 45000 training images, ``val`` the last 5000,
        ``train_full`` all 50000; 0 drops ``val``).

    Returns:
      A :class:`Dataset`.

    Raises:
      ValueError: unknown name, a malformed ``data_dir`` URL or unreachable
        bucket, or missing/empty data (the message says how to prepare it).
    """
    if name not in DATASETS:
        raise ValueError(
            f"Unknown dataset '{name}'. Valid datasets: {', '.join(DATASETS)}."
        )
    if data_dir:  # a malformed URL or missing bucket: named here, not "no data"
        storage.check_reachable(data_dir, what="data_dir")
    return DATASETS[name](data_dir=data_dir, **kwargs)
