r"""Smooth ECE (Błasiok and Nakkiran) and its smoothed reliability curve.

The residuals :math:`y_i - f_i` are smoothed with a Gaussian kernel reflected
at 0 and 1; the smooth ECE at scale :math:`\sigma` is the integral over
:math:`[0, 1]` of the absolute smoothed residual, and the metric's own scale
is the fixed point :math:`\sigma^*` where that integral equals
:math:`\sigma^*`.

Computation (all jittable, no host loop):

1. *Smooth rounding to a grid* (the discretisation of the paper's released
   package ``relplot``): each prediction :math:`f_i` is split between its two
   neighbouring points of the uniform grid :math:`t_j = j/(M - 1)`,
   :math:`j = 0, \dots, M-1`, with linear-interpolation weights, so the mass
   and the mean position of every sample are kept exactly. One O(N) pass.
2. *Reflected Gaussian smoothing in Fourier space.* The reflected Gaussian
   kernel on :math:`[0, 1]` is the heat kernel with reflecting (Neumann)
   boundaries, diagonal in the cosine basis:

   .. math::

       K^R_\sigma(t, u) = \sum_{m \in \mathbb{Z}}
       \big[\varphi_\sigma(t - u - 2m) + \varphi_\sigma(t + u - 2m)\big]
       = 1 + 2\sum_{\omega \ge 1} e^{-\sigma^2\pi^2\omega^2/2}
       \cos(\pi\omega t)\cos(\pi\omega u).

   The grid masses are extended evenly to a circle of :math:`2(M - 1)`
   points, transformed once with a real FFT, and every scale costs one
   multiplication by :math:`e^{-\sigma^2\pi^2\omega^2/2}` and one inverse
   FFT. This gives the exactly smoothed grid masses at the grid points (the
   periodic images are all included; aliasing is below
   :math:`e^{-\sigma^2\pi^2(M-1)^2/2}`, i.e. nil for :math:`\sigma \ge
   10^{-3}` at the default :math:`M`).
3. The integral over :math:`[0, 1]` is the trapezoid rule on the grid.
4. :math:`\sigma^*` by bisection on :math:`[10^{-3}, 1]` with a fixed number
   of steps (``lax.fori_loop``), the bracket of ``relplot``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks
from calib_jax.metrics import _common, _validate

TARGETS = ("top_label", "binary")
CONVENTIONS = ("exact", "relplot")
# Default grid: 2**13 + 1 points, spacing 2**-13 ~ 1.2e-4 (<= sigma/8 on the
# whole bisection bracket; relplot refines its grid to <= sigma/20 only from
# 200 points upwards, so it is coarser for sigma > 1e-3 * 20 / 8).
DEFAULT_NUM_POINTS = 8193
# Bisection bracket of the fixed-point scale, as relplot's search (its
# ``eps = 0.001`` floor and upper end 1).
SIGMA_MIN = 1e-3
SIGMA_MAX = 1.0
BISECTION_STEPS = 30
# Smoothed density (per unit confidence) below which the reliability curve is
# undefined (NaN): float32 FFT round-off of the density is ~1e-6 of its
# maximum, so ratios below this are noise.
_DENSITY_FLOOR = 1e-5


def _check_options(target, num_points, k):
    _checks.check_choice("target", target, TARGETS)
    if target == "binary" and k != 2:
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


def _predictions(probs, labels, target):
    """``(f, y)``: the predicted probability in [0, 1] and the 0/1 outcome."""
    if target == "top_label":
        conf, correct = _common.top_label(probs, labels)
        return conf.astype(jnp.float32), correct.astype(jnp.float32)
    p1 = _common.as_float(probs)[:, 1].astype(jnp.float32)
    return p1, (labels == 1).astype(jnp.float32)


def _deposit(f, values, valid, num_points):
    """Linear ("smooth") rounding of point masses to the grid, ``[M, C]``.

    Sample ``i`` at ``u = f_i (M - 1)`` puts ``(1 - frac) v_i`` on grid point
    ``floor(u)`` and ``frac v_i`` on the next one; ``f`` is clipped to [0, 1]
    (probabilities may exceed 1 by the simplex tolerance).
    """
    m1 = num_points - 1
    u = jnp.clip(f, 0.0, 1.0) * m1
    lo = jnp.clip(jnp.floor(u), 0, m1 - 1)
    frac = u - lo
    lo = lo.astype(jnp.int32)
    values = jnp.where(valid[:, None], values, 0.0)
    idx = jnp.concatenate([lo, lo + 1])
    w = jnp.concatenate([(1.0 - frac)[:, None] * values, frac[:, None] * values])
    return jax.ops.segment_sum(w, idx, num_segments=num_points)


def _spectrum(masses):
    """Real FFT of the even extension of grid masses ``[M, C]`` (doubled ends).

    The circle of ``L = 2(M - 1)`` points holds ``2 rho_0``, ``rho_1``, ...,
    ``2 rho_{M-1}``, ``rho_{M-2}``, ..., ``rho_1``: the kernel sum
    ``sum_k rho_k [g(t_j - t_k) + g(t_j + t_k)]`` is then one circular
    convolution with the period-2 Gaussian ``g``.
    """
    inner = masses[1:-1]
    ext = jnp.concatenate(
        [2.0 * masses[:1], inner, 2.0 * masses[-1:], inner[::-1]], axis=0
    )
    return jnp.fft.rfft(ext, axis=0)


def _smoothed(spectrum, sigma, num_points):
    r"""Smoothed densities at the grid points: ``[M, C]``.

    ``s(t_j) = sum_k rho_k K^R_sigma(t_j, t_k)``; the DFT of the sampled
    period-2 Gaussian is ``(L / 2) exp(-sigma^2 pi^2 omega^2 / 2)``.
    """
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


def _inputs(probs, labels, where, target, num_points, channels):
    f, y = _predictions(probs, labels, target)
    valid = _common.mask_or_ones(where, f.shape[0])
    n = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
    columns = {"residual": y - f, "count": jnp.ones_like(f)}
    values = jnp.stack([columns[c] for c in channels], axis=1) / n
    return _spectrum(_deposit(f, values, valid, num_points))


@functools.partial(jax.jit, static_argnums=(4, 5))
def _smooth_ece_core(probs, labels, where, bandwidth, target, num_points):
    spectrum = _inputs(probs, labels, where, target, num_points, ("residual",))
    sigma = _fixed_point(spectrum, num_points) if bandwidth is None else bandwidth
    return _smece_at(spectrum, sigma, num_points), sigma


@functools.partial(jax.jit, static_argnums=(4, 5))
def _curve_core(probs, labels, where, bandwidth, target, num_points):
    spectrum = _inputs(probs, labels, where, target, num_points, ("residual", "count"))
    sigma = (
        _fixed_point(spectrum[:, :1], num_points) if bandwidth is None else bandwidth
    )
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


# ---------------------------------------------------------------------------
# convention="relplot": relplot 1.0.3's smECE / smECE_sigma as released
# ---------------------------------------------------------------------------

# smECE's ``eps``: a bandwidth below it satisfies the search predicate
# without an evaluation.
_RELPLOT_EPS = 1e-3
# search_param's ``refine``: bisection steps on [0, 1].
_RELPLOT_STEPS = 10
# The smallest bisection midpoint that is evaluated: 1/1024 < eps is not,
# so every evaluated scale is a multiple of 1/1024 of at least 2/1024.
_RELPLOT_MIN_EVAL = 2.0 / 1024
# The scale whose grids bound those of a traced fixed bandwidth.
_RELPLOT_MIN_TRACED = 1e-3


def relplot_grid_sizes(sigma: float) -> tuple[int, int]:
    """relplot's two grids at scale ``sigma``: ``(E, T)``.

    ``E`` = ``max(2000, round(20/sigma)) // 2 + 1`` points for the
    smoothing (``GaussianKernel.apply``), ``T`` = ``max(round(10/sigma),
    200)`` evaluation points for the integral (``metrics.smooth_ece``).
    """
    return max(2000, round(20 / sigma)) // 2 + 1, max(round(10 / sigma), 200)


def _traced_sizes(sigma):
    e = jnp.maximum(2000, jnp.round(20.0 / sigma).astype(jnp.int32)) // 2 + 1
    t = jnp.maximum(jnp.round(10.0 / sigma).astype(jnp.int32), 200)
    return e, t


def _relplot_smece_at(f, columns, sigma, sizes, e_max, t_max):
    """relplot's ``smooth_ece(f, y, sigma)`` on grids of dynamic sizes.

    ``columns`` ``[N, 2]`` holds the residual ``f - y`` and ones (masked
    rows zero); ``sizes = (E, T)`` (int32, at most the static ``e_max`` and
    ``t_max``). Steps, each as relplot 1.0.3 (``kernels.py``):

    1. ``smooth_round_to_grid``: ``f (E - 1)`` in float32 (relplot
       multiplies the float32 confidences by a Python int), its floor
       clipped to ``[0, E - 2]`` and the fraction split linearly.
    2. ``ReflectedGaussianKernel.convolve``: the grid values extended by
       one mirror image at each end *without repeating the end points*
       (``flip(v)[:-1], v, flip(v)[1:]``), correlated with the Gaussian
       sampled at ``j/(E-1) - 1/2``, ``j < E`` (cut at distance 1/2, not
       normalised), and the ``E`` outputs from ``E // 2`` taken (a half
       grid step off centre when ``E`` is even). Here by one FFT of size
       ``4 e_max``.
    3. ``interpolate`` linearly to ``T`` points ``i/(T-1)``; the value is
       ``sum |smoothed residual| / sum (smoothed count + 1e-4)``.
    """
    e, t = sizes
    e1 = (e - 1).astype(jnp.float32)
    u = f * e1
    lo = jnp.clip(jnp.floor(u), 0.0, e1 - 1.0)
    frac = u - lo
    lo = lo.astype(jnp.int32)
    idx = jnp.concatenate([lo, lo + 1])
    w = jnp.concatenate([(1.0 - frac)[:, None] * columns, frac[:, None] * columns])
    values = jax.ops.segment_sum(w, idx, num_segments=e_max)  # [e_max, 2]
    q = jnp.arange(3 * e_max, dtype=jnp.int32)
    src = jnp.where(
        q < e - 1, e - 1 - q, jnp.where(q < 2 * e - 1, q - (e - 1), 3 * e - 3 - q)
    )
    ext = jnp.where((q < 3 * e - 2)[:, None], values[jnp.clip(src, 0, e_max - 1)], 0.0)
    j = jnp.arange(e_max, dtype=jnp.float32)
    sigma = jnp.asarray(sigma, jnp.float32)
    dist = j / e1 - 0.5
    ker = jnp.exp(-dist * dist / (2.0 * sigma * sigma)) / (
        jnp.sqrt(2.0 * jnp.pi) * sigma
    )
    ker = jnp.where(j < e1 + 1.0, ker, 0.0)
    length = 4 * e_max
    spec = (
        jnp.fft.rfft(ext, n=length, axis=0)
        * jnp.conj(jnp.fft.rfft(ker, n=length))[:, None]
    )
    corr = jnp.fft.irfft(spec, n=length, axis=0)
    p = jnp.arange(e_max, dtype=jnp.int32)
    smoothed = corr[jnp.clip(e // 2 + p, 0, length - 1)]  # [e_max, 2]; p < E used
    i = jnp.arange(t_max, dtype=jnp.float32)
    tt = i / (t - 1).astype(jnp.float32)
    pos = tt * e1
    inds = jnp.clip(jnp.floor(pos), 0.0, e1 - 1.0)
    res = (pos - inds)[:, None]
    inds = inds.astype(jnp.int32)
    at_t = smoothed[inds] * (1.0 - res) + smoothed[inds + 1] * res  # [t_max, 2]
    inside = i < t.astype(jnp.float32)
    num = jnp.sum(jnp.where(inside, jnp.abs(at_t[:, 0]), 0.0))
    den = jnp.sum(jnp.where(inside, at_t[:, 1] + 1e-4, 0.0))
    return num / den


def _relplot_fixed_point(f, columns, e_max, t_max):
    """relplot's ``search_param``: 10 bisection steps on [0, 1], keeping
    the upper end; the predicate is ``sigma < eps or sigma < smECE_sigma``."""

    def predicate(sigma):
        evaluated = jnp.maximum(sigma, _RELPLOT_MIN_EVAL)
        value = _relplot_smece_at(
            f, columns, evaluated, _traced_sizes(evaluated), e_max, t_max
        )
        return (sigma < _RELPLOT_EPS) | (sigma < value)

    def step(_, bracket):
        start, end = bracket
        mid = 0.5 * (start + end)
        small = predicate(mid)
        return jnp.where(small, start, mid), jnp.where(small, mid, end)

    one = jnp.float32(1.0)
    start, _ = lax.fori_loop(0, _RELPLOT_STEPS, step, (one, jnp.float32(0.0)))
    return jnp.where(predicate(one), one, start)


@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _relplot_core(probs, labels, where, bandwidth, sizes, target, e_max, t_max):
    f, y = _predictions(probs, labels, target)
    valid = _common.mask_or_ones(where, f.shape[0])
    columns = jnp.stack([f - y, jnp.ones_like(f)], axis=1)
    columns = jnp.where(valid[:, None], columns, 0.0)
    if bandwidth is None:
        sigma = _relplot_fixed_point(f, columns, e_max, t_max)
        sizes = _traced_sizes(sigma)
    else:
        sigma = bandwidth
        if sizes is None:
            sizes = _traced_sizes(jnp.maximum(sigma, _RELPLOT_MIN_TRACED))
    return _relplot_smece_at(f, columns, sigma, sizes, e_max, t_max), sigma


def _relplot_smooth_ece(probs, labels, where, bandwidth, bw, target):
    if bw is None:
        e_max, t_max = relplot_grid_sizes(_RELPLOT_MIN_EVAL)
        sizes = None
    elif _checks.is_concrete(bw):
        # The grids from the value as given (a Python float), as relplot.
        given = float(bandwidth) if np.ndim(bandwidth) == 0 else float(bw)
        e_max, t_max = relplot_grid_sizes(given)
        sizes = tuple(jnp.int32(v) for v in (e_max, t_max))
    else:
        e_max, t_max = relplot_grid_sizes(_RELPLOT_MIN_TRACED)
        sizes = None
    return _relplot_core(probs, labels, where, bw, sizes, target, e_max, t_max)


def _prepare(probs, labels, where, bandwidth, target, num_points):
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    num_points = _check_options(target, num_points, probs.shape[1])
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
) -> jax.Array:
    r"""Smooth ECE: ECE of the kernel-smoothed residuals, at the fixed-point scale.

    With predictions :math:`f_i \in [0, 1]`, outcomes :math:`y_i \in \{0,
    1\}` and the Gaussian kernel :math:`K^R_\sigma` reflected at 0 and 1 (the
    kernel [1] uses for predictions confined to [0, 1]),

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

    Discretisation: the predictions are linearly split between the two
    nearest points of a uniform grid of ``num_points`` points on [0, 1]
    (``relplot``'s "smooth rounding"), smoothed exactly on the grid in
    Fourier space, and integrated with the trapezoid rule; :math:`\sigma^*`
    is found by 30 bisection steps on :math:`[10^{-3}, 1]` and the
    returned value is :math:`\mathrm{smECE}` at the upper end of the final
    bracket.

    ``convention='relplot'`` reproduces ``relplot.smECE`` /
    ``relplot.smECE_sigma`` 1.0.3 as released ([2]; to about 1e-7 in
    tests): its grids (:math:`\max(2000, \mathrm{round}(20/\sigma))
    /\!/ 2 + 1` points for the smoothing, :math:`\max(\mathrm{round}(10 /
    \sigma), 200)` for the integral), its reflection, its kernel cut at
    distance 0.5, its density floor ``1e-4`` and its 10-step bisection on
    [0, 1] keeping the upper end. The dominant difference from the exact
    value is the reflection: relplot mirrors the grid about its end points
    *without repeating them*, so a prediction at exactly 0 or 1 keeps only
    half of its kernel mass, and when many confidences are exactly 1.0
    (float32 softmax of a confident classifier, mostly correct there, so
    with residual 0) the density loses mass where the residual is small and
    the value rises: with 31% / 50% of confidences at 1.0 (synthetic,
    ``docs/metrics.md``) relplot gives 0.0254 / 0.0176 where the exact value
    is 0.0185 / 0.0118. Without mass at the end points the two agree to
    about 5e-4 (the kernel cut and single reflection, growing with
    :math:`\sigma`). A traced ``bandwidth`` uses relplot's grids of
    :math:`\max(\sigma, 10^{-3})`.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex.
      labels: int ``[N]`` class ids in ``[0, K)``.
      bandwidth: ``None`` for the fixed-point scale :math:`\sigma^*`, or a
        scale :math:`\sigma > 0` (traceable); scales below about ten grid
        spacings (``10 / (num_points - 1)``) are under-resolved.
      target: ``'top_label'`` or ``'binary'`` (K = 2).
      num_points: static int, grid size :math:`M` (cost O(N + M log M) per
        scale).
      where: optional bool ``[N]``; ``False`` rows are excluded.
      convention: ``'exact'`` (default; the kernel reflected exactly, as
        described above) or ``'relplot'`` (relplot 1.0.3's discretisation;
        ``num_points`` is then unused).

    Returns:
      float32 scalar in [0, 1].

    References:
      [1] J. Błasiok, P. Nakkiran, "Smooth ECE: Principled Reliability
      Diagrams via Kernel Smoothing", ICLR 2024, arXiv:2309.12236v1: the
      definitions of smECE_sigma (kernel-smoothed residual), the reflected
      Gaussian kernel and SmoothECE = smECE at the fixed point sigma*.
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
    args = _prepare(probs, labels, where, bandwidth, target, num_points)
    probs, labels, where, bw, m = args
    if convention == "relplot":
        return _relplot_smooth_ece(probs, labels, where, bandwidth, bw, target)[0]
    return _smooth_ece_core(probs, labels, where, bw, target, m)[0]


def smooth_reliability(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    bandwidth: jax.typing.ArrayLike | None = None,
    target: str = "top_label",
    num_points: int = DEFAULT_NUM_POINTS,
    where: jax.typing.ArrayLike | None = None,
) -> dict[str, jax.Array]:
    r"""The smoothed reliability curve of :func:`smooth_ece` on its grid.

    Returns a dict: ``grid`` (float32 ``[M]``, :math:`t_j = j/(M-1)`),
    ``accuracy`` (the curve :math:`t + \hat r_\sigma(t)`), ``density``
    (:math:`\hat\delta_\sigma(t)`, integrating to 1 over [0, 1]), ``smece``
    and ``bandwidth`` (scalars: the value of :func:`smooth_ece` and the scale
    :math:`\sigma` used).

    The curve is the prediction plus its Nadaraya-Watson smoothed residual,
    so the gap to the diagonal weighted by the density integrates to the
    smooth ECE (:math:`\int |\mathrm{accuracy}(t) - t|\,\hat\delta(t)\,dt =
    \mathrm{smECE}_\sigma`, the property of the smooth reliability diagram
    in [1]);
    ``relplot`` plots the kernel regression of :math:`y` instead, which
    differs from it by the smoothing bias of the predictions
    (:math:`O(\sigma^2)` inside the interval). Where the density is below
    :math:`10^{-5}` of its maximum (no data within several :math:`\sigma`)
    the curve is NaN.

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
    args = _prepare(probs, labels, where, bandwidth, target, num_points)
    probs, labels, where, bw, m = args
    return _curve_core(probs, labels, where, bw, target, m)
