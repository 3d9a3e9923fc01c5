r"""Smooth ECE (Błasiok and Nakkiran) and its smoothed reliability curve: grid
masses smoothed with the reflected Gaussian in Fourier space, the fixed-point scale
by bisection (``docs/metrics.md``, "Smooth ECE")."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common, _inputs, _smooth_relplot, _validate

TARGETS = ("top_label", "binary")
CONVENTIONS = ("exact", "relplot")
# Spacing 2**-13 ~ 1.2e-4: <= sigma/8 on the whole bisection bracket.
DEFAULT_NUM_POINTS = 8193
# relplot's bracket of the fixed-point scale (its ``eps = 0.001`` and 1).
SIGMA_MIN = 1e-3
SIGMA_MAX = 1.0
BISECTION_STEPS = 30
# Relative density below which the curve is NaN: float32 FFT round-off of the
# density is ~1e-6 of its maximum.
_DENSITY_FLOOR = 1e-5


def _check_options(target, num_points, k):
    """``num_points`` as int; ``k`` is None for top-label rows."""
    if target == "binary" and k is not None and k != 2:
        raise ValueError(
            f"target='binary' needs K = 2 classes (the probability of class 1); "
            f"got K = {k}. Use target='top_label' for K > 2."
        )
    if (
        isinstance(num_points, bool)
        or not isinstance(num_points, (int, np.integer))
        or num_points < 3
    ):
        raise ValueError(f"num_points must be a Python int >= 3, got {num_points!r}.")
    return int(num_points)


def _check_bandwidth(bandwidth):
    """``None`` (the fixed-point rule) or a positive finite scale."""
    if bandwidth is None:
        return None
    bw = jnp.asarray(bandwidth)
    if bw.ndim != 0:
        raise ValueError(f"bandwidth must be a scalar, got shape {bw.shape}.")
    if not jnp.issubdtype(bw.dtype, jnp.floating):
        bw = bw.astype(jnp.float32)
    if _checks.is_concrete(bw):
        value = float(bw)
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(
                f"bandwidth must be None (fixed-point rule) or a finite number "
                f"> 0, got {bandwidth!r}."
            )
    return bw.astype(jnp.float32)


def _spectrum(masses):
    """Real FFT of grid masses ``[M, C]`` extended evenly to a circle of ``2(M - 1)``
    points, ends doubled: the reflected kernel sum is then one circular convolution
    with the period-2 Gaussian."""
    inner = masses[1:-1]
    ext = jnp.concatenate(
        [2.0 * masses[:1], inner, 2.0 * masses[-1:], inner[::-1]], axis=0
    )
    return jnp.fft.rfft(ext, axis=0)


def _smoothed(spectrum, sigma, num_points):
    r"""Smoothed densities ``s(t_j) = sum_k rho_k K^R_sigma(t_j, t_k)``, ``[M, C]``
    (exact: the DFT of the sampled period-2 Gaussian is ``(L / 2) exp(-sigma^2
    pi^2 omega^2 / 2)``)."""
    length = 2 * (num_points - 1)
    omega = jnp.arange(spectrum.shape[0], dtype=jnp.float32)
    gain = (0.5 * length) * jnp.exp(-0.5 * (sigma * jnp.pi * omega) ** 2)
    out = jnp.fft.irfft(spectrum * gain[:, None], n=length, axis=0)
    return out[:num_points]


def _trapezoid(values, num_points):
    """Trapezoid rule on the grid of [0, 1] (over the first axis)."""
    h = 1.0 / (num_points - 1)
    return h * (jnp.sum(values, axis=0) - 0.5 * (values[0] + values[-1]))


def _smece_at(spectrum, sigma, num_points):
    return _trapezoid(jnp.abs(_smoothed(spectrum, sigma, num_points)[:, 0]), num_points)


def _fixed_point(spectrum, num_points):
    """Bisection for ``smECE_sigma = sigma`` on [SIGMA_MIN, SIGMA_MAX]."""

    def step(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        above = _smece_at(spectrum, mid, num_points) > mid
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    start = (jnp.float32(SIGMA_MIN), jnp.float32(SIGMA_MAX))
    _, hi = lax.fori_loop(0, BISECTION_STEPS, step, start)
    return hi


def _grid_spectrum(probs, labels, where, target, num_points, channels):
    f, y = _smooth_relplot.predictions(probs, labels, target)
    valid = _common.mask_or_ones(where, f.shape[0])
    n = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
    columns = {"residual": y - f, "count": jnp.ones_like(f)}
    # Probabilities may exceed 1 by the simplex tolerance.
    u = jnp.clip(f, 0.0, 1.0) * (num_points - 1)
    values = [jnp.where(valid, columns[c] / n, 0.0) for c in channels]
    return _spectrum(_smooth_relplot.deposit(u, num_points - 1, values, num_points))


@functools.partial(jax.jit, static_argnums=(4, 5))
def _smooth_ece_core(probs, labels, where, bandwidth, target, num_points):
    spectrum = _grid_spectrum(probs, labels, where, target, num_points, ("residual",))
    sigma = _fixed_point(spectrum, num_points) if bandwidth is None else bandwidth
    return _smece_at(spectrum, sigma, num_points), sigma


@functools.partial(jax.jit, static_argnums=(4, 5))
def _curve_core(probs, labels, where, bandwidth, target, num_points):
    residual = _grid_spectrum(probs, labels, where, target, num_points, ("residual",))
    count = _grid_spectrum(probs, labels, where, target, num_points, ("count",))
    spectrum = jnp.concatenate([residual, count], axis=1)
    sigma = _fixed_point(residual, num_points) if bandwidth is None else bandwidth
    smooth = _smoothed(spectrum, sigma, num_points)
    residual, density = smooth[:, 0], smooth[:, 1]
    grid = jnp.linspace(0.0, 1.0, num_points, dtype=jnp.float32)
    defined = density > _DENSITY_FLOOR * jnp.max(density)
    curve = jnp.where(
        defined, grid + residual / jnp.where(defined, density, 1.0), jnp.nan
    )
    return {
        "grid": grid,
        "accuracy": curve,
        "density": density,
        "smece": _trapezoid(jnp.abs(residual), num_points),
        "bandwidth": jnp.asarray(sigma, jnp.float32),
    }


def _prepare(probs, labels, where, bandwidth, target, num_points, from_logits, name):
    """Checked ``(x, labels, where, bw, num_points)``; ``labels`` None for rows."""
    _checks.check_choice("target", target, TARGETS)
    form = _inputs.input_form(probs, labels, from_logits=from_logits, metric=name)
    if target == "binary" and form == _inputs.ROWS:
        raise ValueError(
            "target='binary' needs [N, 2] probabilities or logits (the "
            "probability of class 1); got TopLabelRows."
        )
    if target == "binary" and form == _inputs.LOGITS:
        # K = 2: the softmax is two numbers per row.
        probs, labels, where = _inputs.checked_softmax(probs, labels, where)
        form = _inputs.PROBS
    if form == _inputs.PROBS:
        probs, labels, where = _validate.check_probs_labels(probs, labels, where)
        k = probs.shape[1]
    else:
        probs, where = _inputs.top_label_input(
            probs, labels, where, from_logits=from_logits, metric=name
        )
        labels, k = None, None
    num_points = _check_options(target, num_points, k)
    return probs, labels, where, _check_bandwidth(bandwidth), num_points


def smooth_ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    bandwidth: jax.typing.ArrayLike | None = None,
    target: str = "top_label",
    num_points: int = DEFAULT_NUM_POINTS,
    where: jax.typing.ArrayLike | None = None,
    convention: str = "exact",
    from_logits: bool = False,
) -> jax.Array:
    r"""Smooth ECE: ECE of the kernel-smoothed residuals, at the fixed-point scale.

    With predictions :math:`f_i \in [0, 1]`, outcomes :math:`y_i \in \{0,
    1\}` and the Gaussian kernel :math:`K^R_\sigma` reflected at 0 and 1,

    .. math::

        \mathrm{smECE}_\sigma = \int_0^1 \Big|\frac{1}{N}\sum_i
        K^R_\sigma(t, f_i)\,(y_i - f_i)\Big|\,dt
        = \int_0^1 |\hat r_\sigma(t)|\,\hat\delta_\sigma(t)\,dt,

    with :math:`\hat\delta_\sigma(t) = \frac1N\sum_i K^R_\sigma(t, f_i)` the
    smoothed density of the predictions and :math:`\hat r_\sigma` the
    Nadaraya-Watson smoothed residual ([1]). ``bandwidth=None``
    (default) applies the paper's scale rule: :math:`\sigma^*` is the unique
    solution of :math:`\mathrm{smECE}_{\sigma} = \sigma` (smECE is
    non-increasing in :math:`\sigma`), and the metric is
    :math:`\mathrm{smECE}_{\sigma^*}` (the SmoothECE of [1]).

    ``target='top_label'`` (default) measures confidence calibration of a
    K-class model, :math:`f_i = \max_k p_{ik}` and :math:`y_i = [\hat y_i =
    y_i]` (first arg-max, as every top-label metric here); ``'binary'``
    (K = 2 only) uses :math:`f_i = p_{i1}` and :math:`y_i = [y_i = 1]`, the
    binary setting of [1].

    The predictions are split linearly between the two nearest points of a
    grid of ``num_points`` points, smoothed exactly on it and integrated with
    the trapezoid rule; :math:`\sigma^*` comes from 30 bisection steps on
    :math:`[10^{-3}, 1]` (the upper end of the final bracket). Grid, accuracy
    and the ``'relplot'`` convention: ``docs/metrics.md``, "Smooth ECE".

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      bandwidth: ``None`` for the fixed-point scale :math:`\sigma^*`, or a
        scale :math:`\sigma > 0` (traceable); scales below about ten grid
        spacings (``10 / (num_points - 1)``) are under-resolved.
      target: ``'top_label'`` or ``'binary'`` (K = 2).
      num_points: static int, grid size :math:`M` (cost O(N + M log M) per
        scale).
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").
      convention: ``'exact'`` (default) or ``'relplot'``: ``relplot.smECE``
        1.0.3 as released ([2]; its grids, its reflection that keeps half the
        kernel mass of a prediction at exactly 0 or 1, its 10-step search);
        ``num_points`` is then unused and a traced ``bandwidth`` uses
        relplot's grids of :math:`\max(\sigma, 10^{-3})`.

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] J. Błasiok, P. Nakkiran, "Smooth ECE: Principled Reliability
      Diagrams via Kernel Smoothing", ICLR 2024, arXiv:2309.12236v1
      (smECE_sigma, the reflected kernel, SmoothECE at the fixed point).
      [2] ``relplot``, the package released with [1]
      (github.com/apple/ml-calibration, ``src/relplot/metrics.py``,
      ``smECE_fast``; ``kernels.py``, ``smooth_round_to_grid``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.smooth_ece(probs, labels)):.4f}")
      0.0963
    """
    _checks.check_choice("convention", convention, CONVENTIONS)
    args = _prepare(
        probs, labels, where, bandwidth, target, num_points, from_logits, "smooth_ece"
    )
    probs, labels, where, bw, m = args
    if convention == "relplot":
        value, _ = _smooth_relplot.smooth_ece(
            probs, labels, where, bandwidth, bw, target
        )
        return value
    return _smooth_ece_core(probs, labels, where, bw, target, m)[0]


def smooth_reliability(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    bandwidth: jax.typing.ArrayLike | None = None,
    target: str = "top_label",
    num_points: int = DEFAULT_NUM_POINTS,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> dict[str, jax.Array]:
    r"""The smoothed reliability curve of :func:`smooth_ece` on its grid.

    Returns a dict: ``grid`` (float32 ``[M]``, :math:`t_j = j/(M-1)`),
    ``accuracy`` (the curve :math:`t + \hat r_\sigma(t)`), ``density``
    (:math:`\hat\delta_\sigma(t)`, integrating to 1 over [0, 1]), ``smece``
    and ``bandwidth`` (scalars: the value of :func:`smooth_ece` and the scale
    :math:`\sigma` used).

    The gap to the diagonal weighted by the density integrates to the smooth
    ECE (:math:`\int |\mathrm{accuracy}(t) - t|\,\hat\delta(t)\,dt =
    \mathrm{smECE}_\sigma`, as in [1]); ``relplot`` plots the kernel
    regression of :math:`y` instead. Where the density is below
    :math:`10^{-5}` of its maximum the curve is NaN.

    Args as :func:`smooth_ece`.

    References:
      [1] J. Błasiok, P. Nakkiran, "Smooth ECE: Principled Reliability
      Diagrams via Kernel Smoothing", ICLR 2024, arXiv:2309.12236v1
      (smoothed reliability diagrams).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> curve = metrics.smooth_reliability(probs, labels)
      >>> print(curve["grid"].shape, f"{float(curve['smece']):.4f}")
      (8193,) 0.0963
    """
    args = _prepare(
        probs,
        labels,
        where,
        bandwidth,
        target,
        num_points,
        from_logits,
        "smooth_reliability",
    )
    probs, labels, where, bw, m = args
    return _curve_core(probs, labels, where, bw, target, m)
