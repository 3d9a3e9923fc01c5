"""Post-hoc calibrators as pure functions: temperature scaling (NLL, SB-ECE,
HB-ECE search, ECE grid), ETS, PTS, CTS, vector/matrix scaling, Dirichlet
calibration with ODIR, and class-wise loss scaling.

Every fitter takes validation logits ``[N, K]``, labels ``[N]`` and an
optional ``where`` mask and returns parameters; the matching ``apply_*``
function maps logits to calibrated logits. ``fit(name, logits, labels)``
returns a :class:`Calibrator` pytree for the registry path (and the CLI,
``python -m calib_jax.posthoc``).
"""

from calib_jax.posthoc._calibrator import Calibrator, Method
from calib_jax.posthoc._classwise_scaling import (
    fit_alpha_beta,
    fit_classwise,
    normalize_class_losses,
    scaling_weights,
)
from calib_jax.posthoc._cts import apply_cts, fit_cts
from calib_jax.posthoc._dirichlet import apply_dirichlet, fit_dirichlet
from calib_jax.posthoc._ets import apply_ets, fit_ets
from calib_jax.posthoc._matrix import (
    apply_matrix_scaling,
    apply_vector_scaling,
    fit_matrix_scaling,
    fit_vector_scaling,
)
from calib_jax.posthoc._pts import apply_pts, fit_pts
from calib_jax.posthoc._registry import (
    ACCURACY_PRESERVING,
    CALIBRATORS,
    fit,
    get_calibrator,
)
from calib_jax.posthoc._temperature import (
    OBJECTIVES,
    apply_temperature,
    fit_temperature,
)

__all__ = [
    "ACCURACY_PRESERVING",
    "CALIBRATORS",
    "OBJECTIVES",
    "Calibrator",
    "Method",
    "apply_cts",
    "apply_dirichlet",
    "apply_ets",
    "apply_matrix_scaling",
    "apply_pts",
    "apply_temperature",
    "apply_vector_scaling",
    "fit",
    "fit_alpha_beta",
    "fit_classwise",
    "fit_cts",
    "fit_dirichlet",
    "fit_ets",
    "fit_matrix_scaling",
    "fit_pts",
    "fit_temperature",
    "fit_vector_scaling",
    "get_calibrator",
    "normalize_class_losses",
    "scaling_weights",
]
