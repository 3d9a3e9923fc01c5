"""``python -m calib_jax.posthoc``: see :mod:`calib_jax.posthoc._cli`."""

from calib_jax import _cli
from calib_jax.posthoc._cli import main

# After Ctrl-C, without waiting on (or crashing in) the runtime's threads that
# a computation stopped mid-way left; the outputs are removed.
_cli.finish(main())
