"""``python -m calib_jax.posthoc``: see :mod:`calib_jax.posthoc._cli`."""

import os
import sys

from calib_jax.posthoc._cli import EXIT_INTERRUPTED, main

status = main()
if status == EXIT_INTERRUPTED:
    # Ctrl-C can stop a computation mid-way: the interpreter's teardown would
    # wait on, or crash in, the runtime's threads. The outputs are removed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
raise SystemExit(status)
