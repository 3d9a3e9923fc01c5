"""The flags of ``python -m calib_jax.posthoc``, in their own ``FlagValues``
(not ``absl.flags.FLAGS``) so the command can run in-process."""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from calib_jax._cli import UserError
from calib_jax.posthoc import _temperature

PROG = "python -m calib_jax.posthoc"
_HELP = ("-h", "--help", "-help", "--helpfull", "--helpshort")


def _define(fv: flags.FlagValues) -> None:
    """Defines the command's flags in ``fv``."""
    kw = {"flag_values": fv, "module_name": "calib_jax.posthoc._cli"}
    flags.DEFINE_string(
        "workdir",
        None,
        "a training run's workdir: fit on its val logits, score its test and "
        "every shift (instead of --val/--test)",
        **kw,
    )
    flags.DEFINE_string(
        "val",
        None,
        "validation .npz (the fit set), or its shards: a glob, a "
        "comma-separated list, or an .npy file (TS methods only)",
        **kw,
    )
    flags.DEFINE_string(
        "test",
        None,
        "test .npz (the evaluation set), or its shards: a glob, a "
        "comma-separated list, or an .npy file (TS methods only)",
        **kw,
    )
    flags.DEFINE_multi_string(
        "method",
        [],
        "calibrator(s), repeatable or comma-separated: ts, ts:<objective>, ets, "
        "pts, cts, vector, matrix, dirichlet, histogram_binning, isotonic, "
        "platt, beta (K = 2), and <ts|ts:nll|ets|pts|cts>+classwise",
        **kw,
    )
    flags.DEFINE_enum(
        "objective",
        None,
        _temperature.OBJECTIVES,
        "objective of a bare 'ts' (default nll)",
        **kw,
    )
    flags.DEFINE_string(
        "out", None, "output directory (default RUN/posthoc or <test>_posthoc)", **kw
    )
    flags.DEFINE_bool("overwrite", False, "replace existing outputs", **kw)
    flags.DEFINE_integer("seed", 0, "initialisation seed (PTS)", lower_bound=0, **kw)
    flags.DEFINE_integer("num_bins", 15, "bins of the ECE metrics", lower_bound=1, **kw)
    flags.DEFINE_string("logits_key", "logits", "array name of the logits", **kw)
    flags.DEFINE_string("labels_key", "labels", "array name of the labels", **kw)


class Help(Exception):
    """``--help``: the text to print."""


def parse_flags(argv: Sequence[str]) -> flags.FlagValues:
    """Parses ``argv`` (without the program name) into fresh flag values; a
    one-line UserError for an unknown flag, a bad value or a positional."""
    fv = flags.FlagValues()
    _define(fv)
    if any(a in _HELP for a in argv):
        raise Help(
            f"usage: {PROG} (--workdir RUN | --val VAL.npz --test TEST.npz) "
            f"--method NAME[,NAME...] [flags]\n{fv.get_help(include_special_flags=False)}"
        )
    try:
        rest = fv([PROG, *argv])
    except flags.UnrecognizedFlagError as err:
        name = err.flagname
        hint = ""
        if name.replace("-", "_") in fv:
            hint = f" (flags are snake_case: --{name.replace('-', '_')})"
        raise UserError(f"unknown flag --{name}{hint}.") from None
    except flags.Error as err:
        raise UserError(str(err)) from None
    if rest[1:]:
        raise UserError(
            f"unexpected argument(s) {' '.join(rest[1:])!r}: give every value "
            "with its flag (--name=value)."
        )
    return fv
