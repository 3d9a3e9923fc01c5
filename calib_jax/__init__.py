"""calib_jax: calibration losses, metrics and post-hoc calibrators in JAX."""

__version__ = "0.1.0"
