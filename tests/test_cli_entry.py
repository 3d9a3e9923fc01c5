"""calib_jax._cli: one mapping from exceptions to exit statuses and stderr lines."""

from __future__ import annotations

import pytest

from calib_jax import _cli
from calib_jax.posthoc._cli_files import StorageError
from calib_jax.train.checkpoint import CheckpointSaveError
from calib_jax.train.metrics_log import MetricsWriteError
from calib_jax.train.preemption import Interrupted


def _raise(err: BaseException):
    def body():
        raise err

    return body


class _Preempted(_cli.Stopped):
    status = 0


@pytest.mark.parametrize(
    "err, status, line",
    [
        (ValueError("bad --config\n  value"), 2, "error: bad --config value"),
        (_cli.UserError("unknown flag --x."), 2, "error: unknown flag --x."),
        (FloatingPointError("training diverged"), 3, "error: training diverged"),
        (CheckpointSaveError("cannot save step 5"), 4, "error: cannot save step 5"),
        (MetricsWriteError("cannot append"), 4, "error: cannot append"),
        (
            StorageError("cannot write 'a.npz': disk full."),
            4,
            "error: cannot write 'a.npz': disk full. No output of this run was "
            "kept; rerun once the storage is writable.",
        ),
        (Interrupted("interrupted: saved step 7"), 130, "interrupted: saved step 7"),
        (_Preempted("SIGTERM: saved"), 0, "SIGTERM: saved"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_run_main_maps_each_exception_to_one_status_and_line(err, status, line, capsys):
    assert _cli.run_main(_raise(err)) == status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == line + "\n"


def test_run_main_returns_the_body_status_and_lets_other_errors_through(capsys):
    assert _cli.run_main(lambda: None) == 0
    assert _cli.run_main(lambda: 5) == 5
    assert _cli.run_main(_raise(KeyboardInterrupt()), interrupted="stop") == 130
    assert capsys.readouterr().err == "stop\n"
    with pytest.raises(RuntimeError):  # a bug keeps its traceback
        _cli.run_main(_raise(RuntimeError("bug")))


def test_one_line_cuts_a_traceback_to_its_first_and_last_lines():
    text = "Traceback (most recent call last):\n  File 'c.py'\nNameError: x"
    assert _cli.one_line(text) == "Traceback (most recent call last): NameError: x"
    assert _cli.one_line(" a \n\n b ") == "a b"
    assert _cli.one_line("") == "unknown error"
