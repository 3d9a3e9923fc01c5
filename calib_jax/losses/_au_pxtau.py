r"""AU_Pxτ (Zhou et al. 2025, Eqs. (13)-(17)): the loss and its weights.

The histogram side (CDF, threshold, running state) is in ``_au_pxtau_hist``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from calib_jax.losses._au_pxtau_hist import (
    au_cdf,
    au_edges,
    au_score,
    batch_quantile,
    coverage_threshold,
    log_survival,
)
from calib_jax.losses._base import (
    clamp,
    masked_mean,
    row_stats,
    zero_excluded_logits,
)
from calib_jax.losses._confidence import (
    bin_edges,
    check_csf,
    csf_flags,
    csf_score,
    histogram,
)
from calib_jax.losses._validation_base import (
    check_bool,
    check_logits,
    check_num_bins,
    check_positive,
    check_unit_interval,
    check_variant,
    prepare,
    reject,
    valid_mask,
)

_DEFAULT_COVERAGE = 0.9


def _au_weights(logits, mask, nu, tau, coverage, hist, *, num_bins, csf, rows=None):
    """Shared core of au_pxtau / au_pxtau_weights; returns ``beta [B]``."""
    dtype = logits.dtype
    num_classes = logits.shape[-1]
    if rows is None:
        rows = row_stats(logits, **csf_flags(csf))
    score = csf_score(csf, rows)
    edges = bin_edges(csf, num_classes, num_bins, dtype)
    centres = 0.5 * (edges[:-1] + edges[1:])
    if hist is None:
        counts = histogram(score, mask, edges)
    else:
        counts = lax.stop_gradient(jnp.asarray(hist, dtype))
    if tau is None:
        thr = lax.stop_gradient(
            coverage_threshold(counts, edges, jnp.asarray(coverage, dtype))
        )
    else:
        thr = jnp.asarray(tau, dtype)
    log_surv = log_survival(score, counts, centres, nu)
    log_surv_tau = log_survival(thr[None], counts, centres, nu)[0]
    # Eq. (16): rank-based weights below τ, one common weight at and above τ.
    beta = -jnp.where(score < thr, log_surv, log_surv_tau)
    return jnp.where(mask, beta, 0.0)


def _check_au_args(fn, num_bins, nu, tau, coverage, csf, hist, weight_grad, variant):
    num_bins = check_num_bins(num_bins)
    check_positive("nu", nu)
    csf = check_csf(csf)
    if check_variant(variant) == "released_code" and tau is not None:
        reject("au_pxtau", "tau (its tau is the coverage-quantile of the batch)")
    if tau is not None and coverage is not None:
        raise ValueError("Give at most one of tau and coverage, not both.")
    if tau is None and coverage is None:
        coverage = _DEFAULT_COVERAGE
    if coverage is not None:
        check_unit_interval("coverage", coverage)
    if hist is not None and jnp.shape(hist) != (num_bins,):
        raise ValueError(
            f"hist must have shape [num_bins] = ({num_bins},), got {jnp.shape(hist)}."
        )
    weight_grad = check_bool("weight_grad", weight_grad)
    if variant == "released_code" and not weight_grad:
        reject(fn, "weight_grad=False")
    return num_bins, coverage, csf, weight_grad


def au_pxtau(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    nu: jax.typing.ArrayLike = 0.1,
    tau: jax.typing.ArrayLike | None = None,
    coverage: jax.typing.ArrayLike | None = None,
    csf: str = "msp",
    hist: jax.typing.ArrayLike | None = None,
    weight_grad: bool = True,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Selective AURC over the low-confidence region, AU_Pxτ (batch-level).

    The reweighted cross-entropy of Eq. (17) of [1] with the weights of
    Eq. (16), from a histogram of confidence scores (Eq. (14)) smoothed by
    sigmoids (Eq. (15)): :math:`O(B \cdot M)` work, no sort.

    .. math::

        \hat G_\nu(s) = \frac{1}{n}\sum_{k=0}^{M-1} h_k\,
            \sigma\!\Big(\frac{s - c_k}{\nu}\Big), \qquad
        \hat\beta_i = \begin{cases}
            -\ln(1 - \hat G_\nu(\tau)) & g_i \ge \tau,\\
            -\ln(1 - \hat G_\nu(g_i)) & g_i < \tau,
        \end{cases} \qquad
        \widehat{\mathrm{AU}} = \frac{1}{B}\sum_{i=1}^{B} \hat\beta_i\,\ell_i,

    with :math:`g_i` the score (``csf``), :math:`\ell_i = -\log p_{y_i}` (the
    paper's :math:`\ell` is generic, Sec. 3.1), :math:`h_k` the bin counts and
    :math:`c_k` the bin centres (Eq. (13)).

    Conventions (the paper leaves them open):

    * Bins: ``num_bins`` equal-width bins on the CSF's range — :math:`[0, 1]`
      for ``'msp'`` and ``'softmax_margin'``, :math:`[-\log K, 0]` for
      ``'neg_entropy'``; half-open ``[e_k, e_{k+1})`` as in Eq. (14) except the
      last bin, which also holds the top of the range.
    * Threshold: ``tau`` on the CSF's scale, or ``coverage``, the fraction of
      samples treated as low-confidence (App. E.2); then :math:`\tau` is the
      ``coverage``-quantile of the histogram, interpolated linearly inside its
      bin. :math:`\tau` carries no gradient.
    * Gradients: the counts are constants; a weight below :math:`\tau` is
      differentiated through its own score, the weight above is constant — the
      gradient of App. C.4, Eq. (27). ``weight_grad=False`` drops its first
      term :math:`(\nabla\hat\beta_i)\,\ell_i` (constant weights, as in
      :func:`aurc`), leaving :math:`\hat\beta_i\nabla\ell_i`.
    * ``1 - Ĝ`` is evaluated in log space: finite where the sigmoids saturate.

    Training from scratch can collapse with the equations as written: that
    first term lowers the score of every sample below :math:`\tau` in
    proportion to its loss, and near-uniform outputs attract every sample once
    :math:`\nu < \ln K / (2K\ln 2)` (about 0.17 for K = 10; ``make demo`` on
    digits: 36 ± 10% test accuracy with ``nu=0.1``). What trains:
    ``variant='released_code'`` (its score shrinks the weight-gradient term
    about 10x; it reproduces the paper's tables), ``weight_grad=False``, a
    larger :math:`\nu`, or fine-tuning a cross-entropy model.

    With ``hist=None`` the CDF is this batch's histogram; Algorithm 1's running
    histogram is ``hist`` updated first by :func:`au_pxtau_update_hist` (then
    :math:`n` of Eq. (15) is ``sum(hist)``; Eq. (17) still averages this batch).

    Defaults: ``nu=0.1`` (App. E.2), ``coverage=0.9`` (the most frequent
    CIFAR entry of App. Table 3), ``num_bins=15`` (not stated in the paper).

    ``variant='released_code'`` computes the authors' loss (repository
    han678/CalibWeightedRisk, ``loss/selectAU.py``, class ``SelectiveAULoss``,
    with ``loss/hist_rank.py`` and ``loss/aurc.py``; ``reduction='mean'``).
    Differences from the paper, one per line:

    * the score is taken on :math:`s = \mathrm{clamp}(\mathrm{softmax}(z), 10^{-9}, 1 - 10^{-9})` passed through a second softmax (MSP and margin of :math:`\mathrm{softmax}(s)`);
    * ``csf='neg_entropy'`` is :math:`\sum_k s_k\log s_k` normalised as :math:`\mathrm{clamp}((g - \ln K)/(0 - \ln K), 0, 1)`, which is 1 for every :math:`g \le 0`: all weights equal, no weight gradient;
    * the bins are ``num_bins`` equal-width bins on [0, 1] for every CSF;
    * the CDF weights each bin by :math:`\max(h_k, 10^{-12})` over :math:`\max(n, 10^{-12})` (empty bins still count a little);
    * :math:`\tau` is the ``coverage``-quantile of this batch's scores (``torch.quantile``, linear), not of the histogram, and it carries gradient (to the two scores it interpolates, stable order on ties);
    * :math:`\hat G(g_i)` and :math:`\hat G(\tau)` are clamped to :math:`[1/(B+1), B/(B+1)]` (no gradient outside), :math:`B` the number of unmasked rows;
    * ``1 - Ĝ`` is evaluated directly, not in log space;
    * the histogram is a running state: the training script (``src/train.py``) adds each batch before weighting and clears it after every epoch (``hist_cdf.clear()``); here that is ``hist`` updated with ``au_pxtau_update_hist(..., variant='released_code')`` and reset to zeros each epoch (``hist=None`` is the first batch after a reset);
    * no explicit ``tau`` and no ``weight_grad=False`` (both raise a ValueError).

    Its defaults (``num_bins=64``, ``nu=0.05``, a quantile of 0.5; 0.25 from its
    command line, 0.4 in its Tiny-ImageNet configs) are not this function's.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      num_bins: static int, number of histogram bins :math:`M` (Eq. (13)).
      nu: sigmoid smoothing :math:`\nu > 0` of Eq. (15).
      tau: optional low-confidence threshold on the CSF's scale (Eq. (16)).
      coverage: optional fraction in (0, 1] defining ``tau`` (App. E.2); 0.9
        when neither ``tau`` nor ``coverage`` is given.
      csf: static str, ``'msp'``, ``'neg_entropy'`` or ``'softmax_margin'``.
      hist: optional float ``[num_bins]`` running counts (see above).
      weight_grad: static bool; ``False`` stops the gradient through the
        weights (the value is the same).
      variant: static str, ``'paper'`` (Eqs. (13)-(17) of [1]) or
        ``'released_code'`` (the authors' code, see above).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``nu <= 0``, ``num_bins < 1``, ``coverage`` outside (0, 1],
        both ``tau`` and ``coverage`` given, an unknown ``csf`` or
        ``variant``, a ``hist`` of the wrong shape, or
        ``variant='released_code'`` with ``tau`` or ``weight_grad=False``.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC, Focal and
      Inverse Focal Loss", 2025, Eqs. (13)–(17), Algorithm 1, App. C.4 and E.2. Code:
      github.com/han678/CalibWeightedRisk, ``loss/selectAU.py``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(au_pxtau(logits, jnp.array([0, 0, 0, 0]))):.4f}")
      0.2382
    """
    num_bins, coverage, csf, weight_grad = _check_au_args(
        "au_pxtau", num_bins, nu, tau, coverage, csf, hist, weight_grad, variant
    )
    logits, labels, mask = prepare(logits, labels, where)
    if variant == "released_code":
        return _au_pxtau_released(
            logits, labels, mask, nu, coverage, hist, num_bins=num_bins, csf=csf
        )
    return _au_pxtau(
        logits,
        labels,
        mask,
        nu,
        tau,
        coverage,
        hist,
        num_bins=num_bins,
        csf=csf,
        weight_grad=weight_grad,
    )


@functools.partial(jax.jit, static_argnames=("num_bins", "csf", "weight_grad"))
def _au_pxtau(
    logits, labels, mask, nu, tau, coverage, hist, *, num_bins, csf, weight_grad
):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, ce=True, **csf_flags(csf))
    beta = _au_weights(
        logits, mask, nu, tau, coverage, hist, num_bins=num_bins, csf=csf, rows=rows
    )
    if not weight_grad:
        beta = lax.stop_gradient(beta)
    return masked_mean(beta * rows.ce, mask)


def au_pxtau_weights(
    logits: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    nu: jax.typing.ArrayLike = 0.1,
    tau: jax.typing.ArrayLike | None = None,
    coverage: jax.typing.ArrayLike | None = None,
    csf: str = "msp",
    hist: jax.typing.ArrayLike | None = None,
    weight_grad: bool = True,
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""The per-sample weights :math:`\hat\beta_i` of :func:`au_pxtau` (Eq. (16)).

    ``au_pxtau(logits, labels, **kw)`` is the masked mean of
    ``au_pxtau_weights(logits, **kw) * cross_entropy``.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      num_bins, nu, tau, coverage, csf, hist, weight_grad, variant: as in
        :func:`au_pxtau`.
      where: optional bool ``[B]``; ``False`` rows get weight 0.

    Returns:
      float32 ``[B]``, differentiable as described in :func:`au_pxtau`.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration", 2025,
      Eq. (16).

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> w = au_pxtau_weights(logits, tau=0.8)
      >>> print(bool(w[0] == w[3]), bool(w[2] < w[0]))
      True True
    """
    num_bins, coverage, csf, weight_grad = _check_au_args(
        "au_pxtau_weights", num_bins, nu, tau, coverage, csf, hist, weight_grad, variant
    )
    logits = check_logits(logits)
    mask = valid_mask(where, logits.shape[0])
    if variant == "released_code":
        return _au_pxtau_released_weights(
            logits, mask, nu, coverage, hist, num_bins=num_bins, csf=csf
        )
    return _au_pxtau_weights(
        logits,
        mask,
        nu,
        tau,
        coverage,
        hist,
        num_bins=num_bins,
        csf=csf,
        weight_grad=weight_grad,
    )


@functools.partial(jax.jit, static_argnames=("num_bins", "csf", "weight_grad"))
def _au_pxtau_weights(
    logits, mask, nu, tau, coverage, hist, *, num_bins, csf, weight_grad
):
    logits = zero_excluded_logits(logits, mask)
    beta = _au_weights(
        logits, mask, nu, tau, coverage, hist, num_bins=num_bins, csf=csf
    )
    return beta if weight_grad else lax.stop_gradient(beta)


@functools.partial(jax.jit, static_argnames=("num_bins", "csf"))
def _au_pxtau_released(logits, labels, mask, nu, coverage, hist, *, num_bins, csf):
    alpha = _au_pxtau_released_weights(
        logits, mask, nu, coverage, hist, num_bins=num_bins, csf=csf
    )
    ce = row_stats(zero_excluded_logits(logits, mask), labels, ce=True).ce
    return masked_mean(alpha * ce, mask)


@functools.partial(jax.jit, static_argnames=("num_bins", "csf"))
def _au_pxtau_released_weights(logits, mask, nu, coverage, hist, *, num_bins, csf):
    logits = zero_excluded_logits(logits, mask)
    score = au_score(logits, csf)
    # hist is already updated with this batch; without it, this batch's counts.
    if hist is None:
        counts = histogram(score, mask, au_edges(num_bins, score.dtype))
    else:
        counts = jnp.asarray(hist, score.dtype)
    return _released_weights(score, mask, counts, nu, coverage, num_bins=num_bins)


def _released_weights(score, mask, counts, nu, coverage, *, num_bins):
    """The released weights ``alpha`` ``[B]`` (0 on masked rows)."""
    dtype = score.dtype
    edges = au_edges(num_bins, dtype)
    centres = 0.5 * (edges[:-1] + edges[1:])
    nu = jnp.asarray(nu, dtype)
    counts = lax.stop_gradient(counts)
    # tau is the batch quantile of the scores and carries their gradient.
    tau = batch_quantile(score, mask, coverage)
    b = jnp.sum(mask.astype(dtype))
    lo, hi = 1.0 / (b + 1.0), b / (b + 1.0)
    g_x = clamp(au_cdf(score, counts, centres, nu), lo, hi)
    g_tau = clamp(au_cdf(tau[None], counts, centres, nu)[0], lo, hi)
    alpha = jnp.where(
        lax.stop_gradient(score >= tau), -jnp.log(1.0 - g_tau), -jnp.log(1.0 - g_x)
    )
    return jnp.where(mask, alpha, 0.0)
