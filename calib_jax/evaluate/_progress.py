"""Progress over the evaluation sets (kept here for imports; see calib_jax.progress)."""

from calib_jax.progress import Progress

__all__ = ["Progress"]
