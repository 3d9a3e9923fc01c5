"""Shared pieces of the command-line entry points (train, evaluate, benchmark).

All three load an ml_collections config file with ``--config`` and turn every
user error into one line on stderr and exit status 2 (:mod:`calib_jax._cli`). ``--config`` takes a
path or the name of a config shipped in the package (``calib_jax.configs``,
the repository's ``configs/`` directory), so the commands work from any
directory after ``pip install``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from absl import flags
from etils import epath

from calib_jax._cli import fail

# Modules of the configs directory that are not configs.
_NOT_CONFIGS = ("__init__", "common")


def shipped_configs() -> dict[str, epath.Path]:
    """The config files shipped in the package, ``{name: path}`` (name without ``.py``)."""
    root = epath.resource_path("calib_jax.configs")
    return {
        p.name[:-3]: p
        for p in sorted(root.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".py") and p.name[:-3] not in _NOT_CONFIGS
    }


def resolve_config(value: str) -> str:
    """Turns a ``--config`` value into the path of a config file (``:arg`` kept).

    An existing file is used as given. Otherwise a bare name (``digits_ce``,
    ``digits_ce.py``) or a ``configs/<name>.py`` path (the README's commands,
    run outside the repository) names the shipped config of that name.

    Raises:
      ValueError: neither a file nor a shipped config; the message lists the
        shipped configs.
    """
    path, sep, arg = value.partition(":")
    if epath.Path(path).is_file():
        return value
    parent, _, name = path.rpartition("/")
    name = name.removesuffix(".py")
    shipped = shipped_configs()
    if parent.rstrip("/").rpartition("/")[2] in ("", "configs") and name in shipped:
        return f"{shipped[name]}{sep}{arg}"
    raise ValueError(
        f"unknown --config '{path}': no such file and no shipped config of that "
        f"name; shipped configs: {', '.join(shipped)}."
    )


def _with_resolved_config(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of ``--config`` (not ``--config.x=y``) resolved."""
    out = list(argv)
    i = 1
    while i < len(out):
        token = out[i]
        if token == "--":
            break
        flag, eq, value = token.partition("=")
        if flag in ("--config", "-config"):
            if eq:
                out[i] = f"{flag}={resolve_config(value)}"
            elif i + 1 < len(out):
                out[i + 1] = resolve_config(out[i + 1])
                i += 1
        i += 1
    return out


# The line of a Ctrl-C that stopped a run outside its training steps.
RESUME = (
    "interrupted; rerun the same command to resume from the last complete checkpoint."
)


def load_config(flag):
    """The config of a ``config_flags`` holder; a file that failed to load
    (it is loaded lazily, on first access) ends the process with one line."""
    # absl shows INFO records of every library; fsspec logs one per remote read.
    for name in ("absl", "fsspec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        config = flag.value
        config.keys()
    except Exception as e:  # noqa: BLE001 - any error of the config file
        fail(f"could not load --config: {e}")
    return config


def model_options(name: str) -> list[str]:
    """The options (``config.model.kwargs``) model ``name`` takes."""
    import dataclasses  # noqa: PLC0415

    from calib_jax import models  # noqa: PLC0415 - JAX, only for this message

    cls = models.MODELS.get(name)
    if cls is None:
        return ["(unknown model)"]
    fixed = ("parent", "name", "num_classes")
    return [f.name for f in dataclasses.fields(cls) if f.name not in fixed]


def _unknown_override(argv: Sequence[str]) -> str | None:
    """The message for the first ``--config.<path>`` naming no field, else None.

    It names the fields that the parent of the missing one has, or, for
    ``config.model.kwargs`` (empty until set), the model's options; another
    empty parent is set whole, which the message shows.
    """
    files = []
    for token, after in zip(argv[1:], [*argv[2:], ""], strict=True):
        flag, eq, value = token.partition("=")
        if flag in ("--config", "-config"):
            files.append(value if eq else after)
    if not files:
        return None
    try:  # the overrides failed before the flag kept the loaded config
        config = flags.FLAGS["config"].parser.parse(files[-1])
    except Exception:  # noqa: BLE001 - the caller reports the original error
        return None
    for token in argv[1:]:
        if not token.startswith(("--config.", "-config.")):
            continue
        path, _, value = token.split(".", 1)[1].partition("=")
        node, parents = config, []
        for part in path.split("."):
            keys = node.keys() if hasattr(node, "keys") else None
            if keys is None:
                break
            if part not in keys:
                where = ".".join(["config", *parents])
                if keys:
                    have = f"its fields: {', '.join(sorted(keys))}"
                elif parents == ["model", "kwargs"]:
                    have = f"the options of model '{config.model.name}': " + ", ".join(
                        model_options(config.model.name)
                    )
                else:
                    have = (
                        f"it has none; set it whole, e.g. --{where}=\"{{'{part}': "
                        f'{value or "..."}}}"'
                    )
                return f"--config.{path}: {where} has no field '{part}' ({have})."
            node = node[part]
            parents.append(part)
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with config errors (typos, bad values) as one line.

    ``--config`` is first resolved by :func:`resolve_config` (a path, or the
    name of a shipped config).
    """
    try:
        argv = _with_resolved_config(argv)
    except ValueError as e:
        fail(str(e))
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(f"{e}")
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # config_flags raises these for a misspelt or ill-typed --config.x=y;
        # their text is a repr with escaped quotes and newlines.
        text = str(e).encode("utf-8").decode("unicode_escape").replace("'", "")
        unknown = None if "Did you mean" in text else _unknown_override(argv)
        if unknown:
            fail(unknown)
        fail(f"bad --config override: {text}")
    except ImportError as e:  # the config file (loaded to apply overrides) failed
        fail(f"could not load --config: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - any other error of the config file
        fail(f"could not load --config: {type(e).__name__}: {e}")
    return []
