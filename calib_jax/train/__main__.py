"""Command line: ``python -m calib_jax.train --config configs/<file>.py[:arg] --workdir DIR``.

Multi-host: run the same command on every host with ``--coordinator_address``,
``--num_processes`` and ``--process_id`` (or ``--distributed=auto``); see
:mod:`calib_jax.train.distributed`.

User errors (a config typo, an unknown name, a bad workdir) end the run with one
line on stderr and exit code 2, before any compute starts. A run that diverges
(non-finite loss or parameters) ends with one line and exit code 3; its good
checkpoints are kept. Storage that fails while a checkpoint is saved or
while ``metrics.jsonl`` is appended (a full disk) ends the run with one line
naming the path and exit code 4; rerunning the same command resumes from the
last complete checkpoint. A second run on a workdir that a run is using is
refused (one line, exit code 2). SIGTERM saves a checkpoint at the next step
and exits 0; Ctrl-C (SIGINT) does the same, then exits 130 with one line
(pressed twice, or outside the training steps, it stops at once, also with
one line and 130); rerunning resumes.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from calib_jax import _cli
from calib_jax.train import distributed  # defines the multi-host flags
from calib_jax.train.cli import RESUME, load_config, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file (optionally ':arg').", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics and logits."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    config = load_config(_CONFIG)
    _cli.finish(_cli.run_main(lambda: _train(config), interrupted=RESUME))


def _train(config) -> None:
    from calib_jax.train.loop import train_and_evaluate  # after flag parsing

    distributed.initialize_from_flags()  # before any JAX computation
    summary = train_and_evaluate(config, _WORKDIR.value)
    import jax  # already imported by the loop

    if jax.process_index() != 0:
        return
    shown = sorted(
        k for k in summary if k.count("/") == 1 or k.startswith("shift/mean/")
    )
    for key in shown:
        print(f"{key:28s} {summary[key]:.4f}")


def run():
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
