"""``python -m calib_jax.posthoc``: see :mod:`calib_jax.posthoc._cli`."""

from calib_jax.posthoc._cli import main

raise SystemExit(main())
