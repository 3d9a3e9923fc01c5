"""Post-hoc calibrators as pure functions: ``fit_<name>(logits, labels, *,
where=None)`` returns parameters, ``apply_<name>`` calibrated logits, and
``fit(name, ...)`` a saveable :class:`Calibrator`. Methods: ``docs/posthoc.md``.
"""

from calib_jax.posthoc._binary import apply_beta, apply_platt, fit_beta, fit_platt
from calib_jax.posthoc._base import Method
from calib_jax.posthoc._calibrator import (
    ACCURACY_PRESERVING,
    BINARY_ONLY,
    CALIBRATORS,
    Calibrator,
    fit,
    get_calibrator,
    load,
)
from calib_jax.posthoc._classwise_scaling import (
    fit_alpha_beta,
    fit_classwise,
    normalize_class_losses,
    scaling_weights,
)
from calib_jax.posthoc._cts import apply_cts, fit_cts
from calib_jax.posthoc._dirichlet import apply_dirichlet, fit_dirichlet
from calib_jax.posthoc._ets import apply_ets, fit_ets_params
from calib_jax.posthoc._histogram import (
    apply_histogram_binning,
    fit_histogram_binning,
)
from calib_jax.posthoc._isotonic import apply_isotonic, fit_isotonic
from calib_jax.posthoc._matrix import (
    apply_matrix_scaling,
    apply_vector_scaling,
    fit_matrix_scaling,
    fit_vector_scaling,
)
from calib_jax.posthoc._multilabel import (
    MultilabelTemperature,
    apply_multilabel_temperature,
    fit_multilabel_temperature,
)
from calib_jax.posthoc._pts import apply_pts, fit_pts
from calib_jax.posthoc._streamed import fit_of_chunks
from calib_jax.posthoc._temperature import OBJECTIVES, apply_temperature
from calib_jax.posthoc._temperature_fit import fit_temperature
from calib_jax.posthoc._validate import TEMPERATURE_RANGE, SuspiciousFitWarning

__all__ = [
    "ACCURACY_PRESERVING",
    "BINARY_ONLY",
    "CALIBRATORS",
    "OBJECTIVES",
    "TEMPERATURE_RANGE",
    "Calibrator",
    "Method",
    "MultilabelTemperature",
    "SuspiciousFitWarning",
    "apply_beta",
    "apply_cts",
    "apply_dirichlet",
    "apply_ets",
    "apply_histogram_binning",
    "apply_isotonic",
    "apply_matrix_scaling",
    "apply_multilabel_temperature",
    "apply_platt",
    "apply_pts",
    "apply_temperature",
    "apply_vector_scaling",
    "fit",
    "fit_alpha_beta",
    "fit_beta",
    "fit_classwise",
    "fit_cts",
    "fit_dirichlet",
    "fit_ets_params",
    "fit_histogram_binning",
    "fit_isotonic",
    "fit_matrix_scaling",
    "fit_multilabel_temperature",
    "fit_of_chunks",
    "fit_platt",
    "fit_pts",
    "fit_temperature",
    "fit_vector_scaling",
    "get_calibrator",
    "load",
    "normalize_class_losses",
    "scaling_weights",
]
