"""Fitting the temperature of temperature scaling by one of four objectives:
NLL, SB-ECE, HB-ECE search and the 0.1-step ECE grid (:func:`fit_temperature`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from calib_jax import _checks, metrics
from calib_jax.posthoc import _core, _log_t_search, _temperature, _validate

# Default norm order and binning convention of the hard-ECE objectives.
_HARD_DEFAULTS = {
    "hb_ece": {"p": 2, "convention": "calib_jax"},
    "ece_grid": {"p": 1, "convention": "focal_calibration"},
}


def fit_temperature(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    objective: str = "nll",
    where: jax.typing.ArrayLike | None = None,
    max_iter: int = 100,
    tol: float = 1e-6,
    num_bins: int = 15,
    p: float | None = None,
    sb_temperature: float = 0.01,
    sb_kind: str = "lb",
    search_range: tuple[float, float] = (0.05, 20.0),
    grid_size: int = 17,
    levels: int = 4,
    convention: str | None = None,
) -> jax.Array:
    r"""Fits the temperature :math:`T` of temperature scaling; returns a scalar.

    Calibrated probabilities are :math:`\mathrm{softmax}(z / T)`
    (:func:`apply_temperature`). The objective decides what "best" means:

    ``'nll'`` (Guo et al. 2017):
      :math:`\min_T \frac{1}{N}\sum_n -\log\mathrm{softmax}(z_n/T)_{y_n}`,
      by L-BFGS on :math:`u = \log T` from :math:`T = 1` (stops at
      ``max_iter`` or when :math:`|\partial/\partial u| \le` ``tol``). The
      NLL is convex in :math:`1/T`.
    ``'sb_ece'`` (TS-SB-ECE, Sec. 5.2 and App. C of [2]):
      :math:`\min_T \mathrm{SB\text{-}ECE}_{\mathrm{lb},p}(M, T_{\mathrm{sb}})`
      of :math:`z/T` (Eq. (12) of [2]) by the same L-BFGS on :math:`\log T`,
      started from the ``'nll'`` temperature (SB-ECE is not convex in
      :math:`T`: the local minimum reached from there), ended by a root
      search on its derivative where L-BFGS brackets a sign change of it or
      stalls (the :math:`p = 1` minimum is a kink; ``docs/posthoc.md``). Defaults: :math:`M` =
      15 (the paper's, App. G), :math:`p = 2` (the :math:`\ell_2` ECE the
      paper reports), :math:`T_{\mathrm{sb}}` = 0.01 (the paper publishes no
      value) and ``sb_kind='lb'`` (Eq. (12); ``'bin'`` is Eq. (11)).
    ``'hb_ece'`` (TS-HB-ECE, App. C of [2]):
      multi-resolution search of hard-binned top-label ECE (``num_bins``
      equal-width bins, norm ``p`` = 2, ``convention='calib_jax'``, i.e. bins
      ``[lo, hi)``). The paper publishes no grid; here level 0 evaluates
      ``grid_size`` values of :math:`\log T` evenly spaced over
      ``log(search_range)``, and each of ``levels - 1`` refinements as many
      over :math:`\pm` one previous spacing around the incumbent (so the ECE
      never increases). Ties go to the smallest :math:`T` of a level.
    ``'ece_grid'`` (the focal-loss code lineage):
      :math:`T \in \{k / 10\}_{k=1}^{100}` minimising 15-bin equal-width
      ECE with ``p = 1`` and bins ``(lo, hi]``
      (``convention='focal_calibration'``, the ``ECELoss`` of that code);
      ties go to the smallest :math:`T`, as in that code. Use it to compare
      with temperatures in those papers' tables.

    Not differentiable in ``logits``. Under ``jax.jit``/``jax.vmap`` only
    shapes are checked.

    Args:
      logits: float ``[N, K]`` uncalibrated logits (bf16/fp16 are upcast).
      labels: int ``[N]`` class ids in ``[0, K)``.
      objective: ``'nll'``, ``'sb_ece'``, ``'hb_ece'`` or ``'ece_grid'``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      max_iter: L-BFGS iteration cap (``'nll'``, ``'sb_ece'``); traced, so
        changing it does not recompile.
      tol: gradient tolerance in :math:`\log T` (``'nll'``, ``'sb_ece'``).
      num_bins: static number of bins :math:`M` (all but ``'nll'``).
      p: norm order of the ECE objectives; None = the objective's default (2
        for ``'sb_ece'`` and ``'hb_ece'``, 1 for ``'ece_grid'``).
      sb_temperature: soft-binning temperature :math:`T_{\mathrm{sb}}`
        (``'sb_ece'``).
      sb_kind: ``'lb'`` or ``'bin'`` (``'sb_ece'``).
      search_range: ``(T_min, T_max)`` of the ``'hb_ece'`` level-0 grid.
      grid_size: static candidates per level (``'hb_ece'``), >= 3.
      levels: static number of levels (``'hb_ece'``), >= 1.
      convention: binning convention of the hard-ECE objectives; None = the
        objective's default (see above).

    Returns:
      float32 scalar temperature :math:`T > 0`.

    Raises:
      ValueError: unknown objective or option, bad shapes, and for concrete
        inputs NaN/inf logits, labels out of range, ``N = 0`` or ``K < 2``.

    Warns:
      SuspiciousFitWarning: (concrete inputs only) one line when the
        validation accuracy is below chance (1/K) or :math:`T` lies outside
        [0.05, 20] (``docs/posthoc.md``).

    References:
      [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, "On Calibration of
      Modern Neural Networks", ICML 2017, arXiv:1706.04599v2, Sec. 4.2.
      [2] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, arXiv:2108.00106, Eqs. (11)–(12), Sec. 5.2,
      App. C.
      [3] J. Mukhoti et al., "Calibrating Deep Neural Networks using Focal
      Loss", NeurIPS 2020, arXiv:2002.09437 (the temperature grid of its
      released code).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (512, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z / 3.0)
      >>> print(f"{float(fit_temperature(z, y)):.2f}")
      3.46
    """
    _checks.check_choice("objective", objective, _temperature.OBJECTIVES)
    fused = objective == "nll" and _checks.is_concrete(logits, labels, where)
    inputs = (logits, labels, where)
    logits, labels, where = _validate.check_inputs(
        logits, labels, where, values=not fused
    )
    if fused:
        max_iter = _checks.check_positive_int("max_iter", max_iter)
        _checks.check_positive_int("num_bins", num_bins)
        t, *checks = _fit_nll_checked(logits, labels, where, tol, max_iter=max_iter)
        summary, (accuracy, exact, simplex) = _checks.fetch(t, checks)
        _validate.raise_for_screen(summary, logits, labels, where)
        accuracy = accuracy if exact else None
        _validate.report_diagnostics(inputs, accuracy, simplex)
        _validate.warn_if_suspicious(
            logits,
            labels,
            where,
            name="fit_temperature",
            temperatures=t,
            accuracy=accuracy,
            simplex=simplex,
        )
        return t
    t = _dispatch(
        logits,
        labels,
        where,
        objective=objective,
        max_iter=max_iter,
        tol=tol,
        num_bins=num_bins,
        p=p,
        sb_temperature=sb_temperature,
        sb_kind=sb_kind,
        search_range=search_range,
        grid_size=grid_size,
        levels=levels,
        convention=convention,
    )
    _validate.warn_if_suspicious(
        logits, labels, where, name="fit_temperature", temperatures=t
    )
    return t


def check_sb_options(p, sb_temperature, sb_kind):
    """Checks the SB-ECE options (traced values pass); returns ``p``, None
    meaning the default 2."""
    _checks.check_choice("sb_kind", sb_kind, ("lb", "bin"))
    _checks.check_positive("sb_temperature", sb_temperature)
    if p is not None and _checks.is_concrete(p) and not float(p) >= 1:
        raise ValueError(f"p must be >= 1, got {p}.")
    return 2.0 if p is None else p


def _dispatch(
    logits,
    labels,
    where,
    *,
    objective,
    max_iter,
    tol,
    num_bins,
    p,
    sb_temperature,
    sb_kind,
    search_range,
    grid_size,
    levels,
    convention,
):
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    num_bins = _checks.check_positive_int("num_bins", num_bins)
    if objective == "nll":
        return _temperature.fit_nll(logits, labels, where, tol, max_iter=max_iter)
    if objective == "sb_ece":
        p = check_sb_options(p, sb_temperature, sb_kind)
        return _fit_sb_ece(
            logits,
            labels,
            where,
            tol,
            sb_temperature,
            p,
            max_iter=max_iter,
            num_bins=num_bins,
            kind=sb_kind,
        )
    defaults = _HARD_DEFAULTS[objective]
    p = defaults["p"] if p is None else p
    _checks.check_choice("p", p, (1, 2))
    conv = defaults["convention"] if convention is None else convention
    if objective == "ece_grid":
        grid = tuple(k / 10.0 for k in range(1, 101))
        return _fit_hard_grid(
            logits, labels, where, grid=grid, num_bins=num_bins, p=p, convention=conv
        )
    grid_size = _checks.check_positive_int("grid_size", grid_size)
    levels = _checks.check_positive_int("levels", levels)
    if grid_size < 3:
        raise ValueError(f"grid_size must be >= 3, got {grid_size}.")
    lo, hi = (float(v) for v in search_range)
    if not 0 < lo < hi:
        raise ValueError(
            f"search_range must satisfy 0 < T_min < T_max, got {search_range}."
        )
    return _fit_hard_search(
        logits,
        labels,
        where,
        bounds=(lo, hi),
        grid_size=grid_size,
        levels=levels,
        num_bins=num_bins,
        p=p,
        convention=conv,
    )


def _nll_fit_diagnostics(logits, labels, where):
    """``(accuracy, exact, simplex)`` for the fit warning (traceable).

    The accuracy counts rows whose label logit is the row maximum: the
    arg-max accuracy unless such a row has a tie at its maximum, which
    ``S_n(s) >= 2`` at the largest float ``s`` detects (``exact`` False: the
    host computes the arg-max accuracy instead).
    """
    z, labels, w = _core.canonical(logits, labels, where)
    m = jnp.max(z, axis=-1)
    mask = w > 0
    at_max = mask & (_core.pick(z, labels) == m)
    big = jnp.asarray(jnp.finfo(z.dtype).max, z.dtype)
    tied = _temperature.exp_sums(z, m, big) >= 1.5
    accuracy = jnp.sum(at_max) / jnp.maximum(jnp.sum(mask), 1)
    exact = ~jnp.any(at_max & tied)
    mask = jnp.ones(labels.shape, bool) if where is None else where
    return accuracy, exact, _validate.simplex_rows(logits, mask)


@jax.jit
def _fit_nll_checked(logits, labels, where, tol, *, max_iter):
    """:func:`_temperature.fit_nll`, :func:`_validate.screen_summary` and
    :func:`_nll_fit_diagnostics` in one program."""
    t = _temperature.fit_nll(logits, labels, where, tol, max_iter=max_iter)
    summary = _validate.screen_summary(logits, labels, where)
    return t, summary, _nll_fit_diagnostics(logits, labels, where)


@functools.partial(jax.jit, static_argnames=("num_bins", "kind"))
def _fit_sb_ece(
    logits, labels, where, tol, sb_temperature, p, *, max_iter, num_bins, kind
):
    z, labels, w = _core.canonical(logits, labels, where)
    # Start from the NLL temperature: at T = 1 very over-confident logits have
    # saturated confidences and a vanishing SB-ECE gradient.
    u0 = _temperature.fit_log_t_nll(
        z, labels, w, jnp.zeros((), z.dtype), max_iter=max_iter, tol=tol
    )
    objective = _temperature.sb_ece_objective(
        z,
        labels,
        where,
        num_bins=num_bins,
        temperature=sb_temperature,
        p=p,
        kind=kind,
    )
    u = _log_t_search.minimize_log_t(objective, u0, max_iter=max_iter, gtol=tol)
    return jnp.exp(u).astype(jnp.float32)


def _hard_ece_of_log_t(z, labels, where, *, num_bins, p, convention):
    """``u -> hard top-label ECE of softmax(z / exp(u))`` (jittable)."""
    m = jnp.max(z, axis=-1)
    correct = jnp.argmax(z, axis=-1) == labels  # the library's correctness rule

    def ece(u):
        conf = _temperature.top_confidence_of_log_t(u, z, m)
        stats = metrics.BinnedStats.from_confidences(
            conf, correct, num_bins=num_bins, convention=convention, where=where
        )
        return stats.compute(p)

    return ece


@functools.partial(jax.jit, static_argnames=("grid", "num_bins", "p", "convention"))
def _fit_hard_grid(logits, labels, where, *, grid, num_bins, p, convention):
    z, labels, _ = _core.canonical(logits, labels, where)
    ece = _hard_ece_of_log_t(
        z, labels, where, num_bins=num_bins, p=p, convention=convention
    )
    temps = jnp.asarray(grid, jnp.float32)
    values = jax.lax.map(ece, jnp.log(temps).astype(z.dtype))
    return temps[jnp.argmin(values)]


@functools.partial(
    jax.jit,
    static_argnames=("bounds", "grid_size", "levels", "num_bins", "p", "convention"),
)
def _fit_hard_search(
    logits, labels, where, *, bounds, grid_size, levels, num_bins, p, convention
):
    z, labels, _ = _core.canonical(logits, labels, where)
    ece = _hard_ece_of_log_t(
        z, labels, where, num_bins=num_bins, p=p, convention=convention
    )
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    offsets = jnp.linspace(-1.0, 1.0, grid_size, dtype=z.dtype)
    half_width = (hi - lo) / 2.0
    centre = jnp.asarray((hi + lo) / 2.0, z.dtype)
    for _ in range(levels):
        candidates = centre + half_width * offsets
        values = jax.lax.map(ece, candidates)
        centre = candidates[jnp.argmin(values)]
        # The next level spans +- one spacing of this one around the best.
        half_width = 2.0 * half_width / (grid_size - 1)
    return jnp.exp(centre).astype(jnp.float32)
