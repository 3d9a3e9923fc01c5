"""``python -m calib_jax.benchmark --config configs/benchmark_<name>.py --workdir DIR``.

Rerunning the same command resumes: finished cells are read back, not
recomputed. User errors (unknown method or calibrator, an empty grid, a config
typo, a workdir of another benchmark) print one line on stderr and exit with
status 2 before any compute. Multi-host: the same command on every host with
``--coordinator_address``, ``--num_processes`` and ``--process_id`` (or
``--distributed=auto``), as for ``python -m calib_jax.train``; every process
runs every cell (the train steps span all devices), process 0 writes the rows
and the report, and the workdir must be on storage all hosts share (a
``gs://`` bucket, NFS). A malformed or unreachable ``gs://`` workdir is one
line, exit status 2, before any compute. Storage that fails while a cell's
checkpoint or its ``metrics.jsonl`` is written is one line naming the path,
exit status 4; rerunning resumes. A second benchmark on a workdir in use, and
a training run's workdir, are refused (one line, exit status 2). Ctrl-C
(SIGINT) saves the training cell's checkpoint at its next step (outside the
training steps it stops at once), prints one line and exits with status 130;
rerunning resumes. SIGTERM in a cell's training saves its checkpoint, prints
one line and exits with status 0, as the trainer does; rerunning resumes.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from calib_jax import _cli
from calib_jax.train import distributed  # defines the multi-host flags
from calib_jax.train.cli import RESUME, load_config, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Path to a benchmark config file (optionally ':arg').",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for the cells, results.jsonl, report.md and plots."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    config = load_config(_CONFIG)
    _cli.finish(_cli.run_main(lambda: _benchmark(config), interrupted=RESUME))


def _benchmark(config) -> None:
    from calib_jax.benchmark.runner import run  # after flag parsing

    distributed.initialize_from_flags()  # before any JAX computation
    path = run(config, _WORKDIR.value)
    import jax  # already imported by the runner

    if jax.process_index() == 0:
        print(f"report: {path}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
