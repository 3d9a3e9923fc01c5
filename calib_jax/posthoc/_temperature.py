r"""Temperature scaling with four objectives: NLL, SB-ECE, HB-ECE search and
the 0.1-step ECE grid.

Temperatures reported by papers are not comparable across these rules: the
focal-loss code lineage picks :math:`T` from a grid on hard 15-bin ECE
(``'ece_grid'``), most others minimise the NLL (``'nll'``), and the
soft-calibration paper minimises soft-binned ECE (``'sb_ece'``) or searches
hard-binned ECE (``'hb_ece'``). All four are pure and jittable, and vmap over
seeds/splits.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from calib_jax import _checks, kernels, losses, metrics
from calib_jax.posthoc import _blocked, _calibrator, _core, _validate

OBJECTIVES = ("nll", "sb_ece", "hb_ece", "ece_grid")

# Default norm order and binning convention of the hard-ECE objectives.
_HARD_DEFAULTS = {
    "hb_ece": {"p": 2, "convention": "calib_jax"},
    "ece_grid": {"p": 1, "convention": "focal_calibration"},
}


def apply_temperature(
    logits: jax.typing.ArrayLike, t: jax.typing.ArrayLike
) -> jax.Array:
    r"""Temperature-scaled logits :math:`z / T` (accuracy-preserving).

    .. math::

        \mathrm{TS}(z) = z / T, \qquad T > 0 \quad \text{(Eq. (12) of [1])}

    Dividing by a positive scalar keeps the order of the logits, so the
    argmax (and hence accuracy) is unchanged.

    Args:
      logits: float ``[..., K]`` logits.
      t: positive temperature, scalar (or broadcastable to ``logits[..., :1]``).

    Returns:
      float ``[..., K]`` calibrated logits (float32 for low-precision input).

    Raises:
      ValueError: a concrete ``t`` that is not finite and > 0.

    References:
      [1] S. Jung et al., "Scaling of Class-wise Training Losses for Post-hoc
      Calibration", ICML 2023, PMLR 202, Eq. (12); C. Guo et al., "On
      Calibration of Modern Neural Networks", ICML 2017, arXiv:1706.04599v2,
      Sec. 4.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(apply_temperature(jnp.array([[2.0, 1.0]]), 2.0))
      [[1.  0.5]]
    """
    t = _validate.check_temperature(t)
    logits = jnp.asarray(logits)
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    return logits.astype(dtype) / t.astype(dtype)


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
      by ``optax.lbfgs`` on :math:`u = \log T` (from :math:`T = 1`) inside
      ``lax.while_loop`` (stops at ``max_iter`` or when
      :math:`|\partial/\partial u| \le` ``tol``). The NLL is convex in
      :math:`1/T`. Value and derivative come from one fused, row-blocked pass
      over the logits per evaluation,

      .. math::

          \ell(s) = \sum_n \omega_n\big(\log S_n(s) + s(m_n - z_{n y_n})\big),
          \quad
          \ell'(s) = \sum_n \omega_n\Big(\frac{W_n(s)}{S_n(s)} + m_n -
          z_{ny_n}\Big),

      :math:`s = 1/T`, with :math:`S, W, m` of ``_blocked.py``.
    ``'sb_ece'`` (TS-SB-ECE, Sec. 5.2 and App. C of [2]):
      :math:`\min_T \mathrm{SB\text{-}ECE}_{\mathrm{lb},p}(M, T_{\mathrm{sb}})`
      of :math:`z/T` (Eq. (12) of [2]) by the same L-BFGS on :math:`\log T`,
      started from the ``'nll'`` temperature. The objective is the value of
      :func:`calib_jax.losses.sb_ece` on :math:`z/T`, evaluated without the
      ``[N, K]`` softmax: SB-ECE sees the logits only through the top-label
      confidences :math:`c_n = 1/S_n(1/T)` and the correctness
      :math:`z_{ny_n} = \max_k z_{nk}` (fixed in :math:`T`), so value and
      derivative cost one fused, row-blocked pass (:math:`S, W`, as for the
      NLL; :math:`\partial c_n/\partial\log T = W_n / (T S_n^2)`) plus
      ``O(N M)`` soft binning of the ``[N]`` confidences. (From
      :math:`T = 1`, very over-confident logits have all confidences
      saturated at 1 and a vanishing SB-ECE gradient; the NLL start avoids
      that and usually halves the number of SB-ECE evaluations.)
      Defaults: :math:`M` = ``num_bins`` = 15 (the paper's fixed M, App. G),
      :math:`p = 2` (the :math:`\ell_2` ECE the paper reports),
      soft-binning temperature :math:`T_{\mathrm{sb}}` = ``sb_temperature`` =
      0.01 (tuned per setting in the paper, no value published) and
      ``sb_kind='lb'`` (Eq. (12), the paper's training variant; ``'bin'`` is
      Eq. (11)). SB-ECE is not convex in :math:`T`; L-BFGS returns the local
      minimum reached from the NLL temperature.
    ``'hb_ece'`` (TS-HB-ECE, App. C of [2]):
      multi-resolution search of hard-binned top-label ECE (``num_bins``
      equal-width bins, norm ``p`` = 2, ``convention='calib_jax'``, i.e. bins
      ``[lo, hi)``, see :mod:`calib_jax.metrics`). The paper names the method
      but publishes no grid; this one is: level 0 evaluates ``grid_size``
      values of :math:`\log T` evenly spaced over ``log(search_range)``; each
      of the ``levels - 1`` refinements evaluates ``grid_size`` values evenly
      spaced over :math:`\pm` one previous spacing around the incumbent (which
      is itself re-evaluated, so the ECE never increases). With the defaults
      (17, 4, [0.05, 20]) that is 68 evaluations and a final spacing of
      :math:`\log(400)/16/8^3 \approx 7.3\cdot 10^{-4}` in :math:`\log T`.
      Hard ECE is piecewise constant in :math:`T`: ties go to the smallest
      :math:`T` of a level.
    ``'ece_grid'`` (the focal-loss code lineage):
      :math:`T \in \{0.1, 0.2, \dots, 10.0\}` (100 values, computed as
      ``k / 10`` rather than by repeated addition of 0.1) minimising 15-bin
      equal-width ECE with ``p = 1`` and bins ``(lo, hi]``
      (``convention='focal_calibration'``, the ``ECELoss`` of that code);
      ties go to the smallest :math:`T`, as the strict ``<`` update of that
      code does. Use it to compare with temperatures in those papers' tables.

    The hard-ECE objectives compute top-label confidences :math:`1/S_n(1/T)`
    for all candidates with the blocked pass (``O(V N K)`` for ``V``
    candidates, App. C of [2]) and bin them with
    :meth:`calib_jax.metrics.BinnedStats.from_confidences`; correctness
    (:math:`z_{ny_n} = \max_k z_{nk}`) does not depend on :math:`T`.

    The fit is not differentiable with respect to ``logits`` (the loops stop
    on data-dependent conditions). Concrete inputs are validated on the host;
    under ``jax.jit``/``jax.vmap`` only shapes are checked.

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
        [0.05, 20]: labels misaligned with the logits (:math:`T \gg 1`, low
        accuracy) or probabilities passed as logits (:math:`T \ll 1`).

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
    _checks.check_choice("objective", objective, OBJECTIVES)
    fused = objective == "nll" and _checks.is_concrete(logits, labels, where)
    inputs = (logits, labels, where)
    logits, labels, where = _validate.check_inputs(
        logits, labels, where, values=not fused
    )
    if fused:
        # One compiled call: the fit, the value summary of its inputs and the
        # fit warning's diagnostics.
        max_iter = _checks.check_positive_int("max_iter", max_iter)
        _checks.check_positive_int("num_bins", num_bins)
        t, summary, (accuracy, exact, simplex) = _fit_nll_checked(
            logits, labels, where, tol, max_iter=max_iter
        )
        _validate.raise_for_screen(summary, logits, labels, where)
        accuracy = accuracy if bool(exact) else None
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
        return _fit_nll(logits, labels, where, tol, max_iter=max_iter)
    if objective == "sb_ece":
        _checks.check_choice("sb_kind", sb_kind, ("lb", "bin"))
        if _checks.is_concrete(sb_temperature) and not float(sb_temperature) > 0:
            raise ValueError(f"sb_temperature must be > 0, got {sb_temperature}.")
        if p is not None and _checks.is_concrete(p) and not float(p) >= 1:
            raise ValueError(f"p must be >= 1, got {p}.")
        return _fit_sb_ece(
            logits,
            labels,
            where,
            tol,
            sb_temperature,
            2.0 if p is None else p,
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


# ---------------------------------------------------------------------------
# 'nll'
# ---------------------------------------------------------------------------


@jax.custom_jvp
def nll_of_log_t(u, z, m, a, w):
    r"""Weighted NLL of :math:`z / e^{u}` with a fused derivative in ``u``.

    ``u`` is a scalar :math:`\log T` or per-row ``[N]`` (PTS). The other
    arguments are constants of the fit: ``z`` ``[N, K]`` logits, ``m`` ``[N]``
    row maxima, ``a = m - z_y`` ``[N]`` and weights ``w`` ``[N]``; no
    derivative is provided for them (callers stop their gradients).

    Kernel family ``'posthoc_temperature'`` (:mod:`calib_jax.kernels`): the
    plain formulation is :func:`nll_of_log_t_plain`; float64 reference in
    ``tests/_reference_posthoc.py``.
    """
    s = jnp.exp(-u)
    big_s = _blocked.exp_sums(z, m, s, with_w=False)
    return jnp.sum(w * (jnp.log(big_s) + s * a))


def nll_of_log_t_plain(u, z, m, a, w):
    """Plain :func:`nll_of_log_t`: one pass over ``z`` and JAX autodiff in ``u``."""
    s = jnp.exp(-u)
    big_s = _blocked.exp_sums_plain(z, m, s, with_w=False)
    return jnp.sum(w * (jnp.log(big_s) + s * a))


@nll_of_log_t.defjvp
def _nll_of_log_t_jvp(primals, tangents):
    u, z, m, a, w = primals
    s = jnp.exp(-u)
    big_s, big_w = _blocked.exp_sums(z, m, s, with_w=True)
    value = jnp.sum(w * (jnp.log(big_s) + s * a))
    # d/du_n of the row-n term: -s_n w_n (W_n / S_n + m_n - z_ny).
    slope = -s * w * (big_w / big_s + a)
    return value, jnp.sum(slope * tangents[0])


def nll_objective(logits, labels, weights):
    """``u -> sum_n w_n NLL_n(z / exp(u))`` with its fused derivative.

    Args:
      logits: float ``[N, K]`` (excluded rows zeroed).
      labels: int ``[N]``.
      weights: float ``[N]`` non-negative, summing to 1.

    Returns:
      A scalar function of :math:`u = \\log T` (scalar or ``[N]``),
      differentiable in ``u``.
    """
    z = jax.lax.stop_gradient(logits)
    m = jnp.max(z, axis=-1)
    a = m - _core.pick(z, labels)
    w = jax.lax.stop_gradient(weights)
    return lambda u: kernels.select(
        "posthoc_temperature", nll_of_log_t, nll_of_log_t_plain, u, z, m, a, w
    )


def fit_log_t_nll(logits, labels, weights, u0, *, max_iter, tol=1e-6):
    """L-BFGS on the weighted NLL in ``u = log T`` from ``u0``; returns ``u``."""
    u, _ = _core.lbfgs_minimize(
        nll_objective(logits, labels, weights), u0, max_iter=max_iter, gtol=tol
    )
    return u


@jax.jit
def _fit_nll(logits, labels, where, tol, *, max_iter):
    z, labels, w = _core.canonical(logits, labels, where)
    u = fit_log_t_nll(z, labels, w, jnp.zeros((), z.dtype), max_iter=max_iter, tol=tol)
    return jnp.exp(u).astype(jnp.float32)


def _nll_fit_diagnostics(logits, labels, where):
    """``(accuracy, exact, simplex)`` for the fit warning, from the NLL fit's
    own row maxima (traceable).

    The accuracy counts rows whose label logit equals the row maximum; that
    is the arg-max accuracy unless such a row has another entry at its
    maximum. One blocked pass at :math:`s` = the largest float (every entry
    below the maximum contributes 0 to :math:`S_n(s)`, every entry at it 1)
    finds those rows without an arg-max over ``[N, K]`` (which costs about
    5x that pass on XLA:CPU); ``exact`` is False when there is one, and the
    host then computes the arg-max accuracy instead.
    """
    z, labels, w = _core.canonical(logits, labels, where)
    m = jnp.max(z, axis=-1)
    mask = w > 0
    at_max = mask & (_core.pick(z, labels) == m)
    big = jnp.asarray(jnp.finfo(z.dtype).max, z.dtype)
    tied = _blocked.exp_sums(z, m, big, with_w=False) >= 1.5
    accuracy = jnp.sum(at_max) / jnp.maximum(jnp.sum(mask), 1)
    exact = ~jnp.any(at_max & tied)
    mask = jnp.ones(labels.shape, bool) if where is None else where
    return accuracy, exact, _validate.simplex_rows(logits, mask)


@jax.jit
def _fit_nll_checked(logits, labels, where, tol, *, max_iter):
    """:func:`_fit_nll`, :func:`_validate.screen_summary` and
    :func:`_nll_fit_diagnostics` in one program."""
    t = _fit_nll(logits, labels, where, tol, max_iter=max_iter)
    summary = _validate.screen_summary(logits, labels, where)
    return t, summary, _nll_fit_diagnostics(logits, labels, where)


# ---------------------------------------------------------------------------
# 'sb_ece'
# ---------------------------------------------------------------------------


@jax.custom_jvp
def top_confidence_of_log_t(u, z, m):
    r"""Top-label confidences :math:`c_n = 1 / S_n(e^{-u})` of :math:`z / e^u`.

    ``u`` is a scalar :math:`\log T` (or per-row ``[N]``); ``z`` ``[N, K]``
    logits and ``m`` ``[N]`` their row maxima are constants of the fit (no
    derivative is provided for them; callers stop their gradients). The
    derivative comes from the same blocked pass as the value:

    .. math::

        \frac{\partial c_n}{\partial u} = s\,\frac{W_n(s)}{S_n(s)^2}
        \le 0, \qquad s = e^{-u},

    with :math:`S, W` of ``_blocked.py``. Kernel family
    ``'posthoc_temperature'``: the plain formulation is
    :func:`top_confidence_of_log_t_plain`.
    """
    return _blocked.top_confidence(z, m, jnp.exp(-u))


def top_confidence_of_log_t_plain(u, z, m):
    """Plain :func:`top_confidence_of_log_t`: one pass and JAX autodiff."""
    return 1.0 / _blocked.exp_sums_plain(z, m, jnp.exp(-u), with_w=False)


@top_confidence_of_log_t.defjvp
def _top_confidence_of_log_t_jvp(primals, tangents):
    u, z, m = primals
    s = jnp.exp(-u)
    big_s, big_w = _blocked.exp_sums(z, m, s, with_w=True)
    c = 1.0 / big_s
    # dc_n/du = -(dS_n/ds)(ds/du) / S_n^2 = s W_n c_n^2.
    return c, s * big_w * c * c * tangents[0]


def sb_ece_objective(logits, labels, where, *, num_bins, temperature, p, kind):
    r"""``u -> SB-ECE of softmax(z / exp(u))`` with a fused derivative in ``u``.

    The same value as :func:`calib_jax.losses.sb_ece` of the scaled logits:
    SB-ECE depends on them only through the top-label confidences (one
    row-blocked pass, :func:`top_confidence_of_log_t`) and the correctness
    (the first arg-max index is the label, the library's rule), which does not
    depend on :math:`T`;
    the soft binning is ``O(N M)`` work on ``[N]`` vectors.

    Args:
      logits: float ``[N, K]`` (excluded rows zeroed).
      labels: int ``[N]``.
      where: optional bool ``[N]``; ``False`` rows are ignored.
      num_bins: static number of bins :math:`M`.
      temperature: soft-binning temperature.
      p: norm order.
      kind: static ``'lb'`` or ``'bin'``.

    Returns:
      A scalar function of :math:`u = \log T`, differentiable in ``u``.
    """
    z = jax.lax.stop_gradient(logits)
    m = jnp.max(z, axis=-1)
    correct = (jnp.argmax(z, axis=-1) == labels).astype(z.dtype)
    mask = jnp.ones(m.shape, bool) if where is None else jnp.asarray(where, bool)

    def objective(u):
        conf = kernels.select(
            "posthoc_temperature",
            top_confidence_of_log_t,
            top_confidence_of_log_t_plain,
            u,
            z,
            m,
        )
        return losses.sb_ece_from_confidences(
            conf, correct, mask, temperature, p, num_bins=num_bins, kind=kind
        )

    return objective


@functools.partial(jax.jit, static_argnames=("num_bins", "kind"))
def _fit_sb_ece(
    logits, labels, where, tol, sb_temperature, p, *, max_iter, num_bins, kind
):
    z, labels, w = _core.canonical(logits, labels, where)
    # Start from the NLL temperature: near the SB-ECE optimum in practice, and
    # away from the flat region of saturated confidences that very
    # over-confident logits have at T = 1 (there the SB-ECE gradient vanishes).
    u0 = fit_log_t_nll(z, labels, w, jnp.zeros((), z.dtype), max_iter=max_iter, tol=tol)
    objective = sb_ece_objective(
        z,
        labels,
        where,
        num_bins=num_bins,
        temperature=sb_temperature,
        p=p,
        kind=kind,
    )
    u, _ = _core.lbfgs_minimize(objective, u0, max_iter=max_iter, gtol=tol)
    return jnp.exp(u).astype(jnp.float32)


# ---------------------------------------------------------------------------
# 'hb_ece' and 'ece_grid'
# ---------------------------------------------------------------------------


def _hard_ece_of_log_t(z, labels, where, *, num_bins, p, convention):
    """``u -> hard top-label ECE of softmax(z / exp(u))`` (jittable)."""
    m = jnp.max(z, axis=-1)
    correct = jnp.argmax(z, axis=-1) == labels  # the library's correctness rule

    def ece(u):
        conf = _blocked.top_confidence(z, m, jnp.exp(-u))
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


# ---------------------------------------------------------------------------
# Registry / class-wise scaling adapter
# ---------------------------------------------------------------------------


def apply_ts_params(params, logits):
    """``apply_fn`` of a TS :class:`~calib_jax.posthoc.Calibrator`."""
    return logits / params["temperature"].astype(logits.dtype)


def check_ts_params(params, *, values: bool = True) -> None:
    """TS parameters ``{'temperature': []}``, finite and > 0 (any K)."""
    t = _calibrator.param_arrays(params, {"temperature": 0})["temperature"]
    if values:
        _calibrator.check_param_values("params['temperature']", t, positive=True)


def ts_method(*, max_iter: int = 100, tol: float = 1e-6):
    """TS with the NLL objective as a :class:`~calib_jax.posthoc._calibrator.Method`."""

    def init(logits, labels, weights, key):
        del labels, weights, key
        return {"temperature": jnp.ones((), logits.dtype)}

    def train(params, logits, labels, weights, budget):
        u0 = jnp.log(params["temperature"]).astype(logits.dtype)
        u = fit_log_t_nll(logits, labels, weights, u0, max_iter=budget, tol=tol)
        return {"temperature": jnp.exp(u)}

    return _calibrator.Method("ts", init, train, apply_ts_params, max_iter, True)
