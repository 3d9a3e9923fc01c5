r"""AU_Pxτ, the selective AURC over the low-confidence region.

A batch-level reweighted risk

.. math::

    \frac{1}{n}\sum_{i=1}^{n} \beta_i\,\ell_i, \qquad
    \ell_i = -\log \mathrm{softmax}(z_i)_{y_i},

whose weights :math:`\beta_i` come from a smoothed, bin-based CDF of the
confidence scores :math:`g(z_i)` (Zhou et al. 2025, Eqs. (10)–(17)); no sort.
``_au_pxtau_hist.py`` holds the histogram side: the smoothed CDF of
Eq. (15), the coverage threshold, and the running-histogram state
(:func:`au_pxtau_update_hist`) that threads the CDF across batches.
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


def _au_weights(logits, mask, *, num_bins, nu, tau, coverage, csf, hist, rows=None):
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


def _check_au_args(num_bins, nu, tau, coverage, csf, hist, variant="paper"):
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
    return num_bins, coverage, csf


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
    Eq. (16), computed from a histogram of confidence scores (Eq. (14)) smoothed
    by sigmoids (Eq. (15)): :math:`O(B \cdot M)` work, no sort.

    .. math::

        \hat G_\nu(s) = \frac{1}{n}\sum_{k=0}^{M-1} h_k\,
            \sigma\!\Big(\frac{s - c_k}{\nu}\Big), \qquad
        \hat\beta_i = \begin{cases}
            -\ln(1 - \hat G_\nu(\tau)) & g_i \ge \tau,\\
            -\ln(1 - \hat G_\nu(g_i)) & g_i < \tau,
        \end{cases} \qquad
        \widehat{\mathrm{AU}} = \frac{1}{B}\sum_{i=1}^{B} \hat\beta_i\,\ell_i,

    with :math:`g_i` the confidence score (``csf``), :math:`\ell_i =
    -\log p_{y_i}` the cross-entropy (the paper's :math:`\ell` is generic,
    "such as cross-entropy", Sec. 3.1), :math:`h_k` the bin counts and
    :math:`c_k` the bin centres (Eq. (13)). All samples at or above :math:`\tau`
    get the same weight.

    Conventions (the paper leaves them open):

    * Bins: ``num_bins`` equal-width bins on the CSF's range — :math:`[0, 1]`
      for ``'msp'`` and ``'softmax_margin'``, :math:`[-\log K, 0]` for
      ``'neg_entropy'``; half-open ``[e_k, e_{k+1})`` as in Eq. (14) except the
      last bin, which also holds the top of the range.
    * Threshold: ``tau`` on the CSF's scale, or ``coverage`` in (0, 1], the
      fraction of samples treated as low-confidence (App. E.2 of [1]); then
      :math:`\tau` is the ``coverage``-quantile of the histogram, interpolated
      linearly inside its bin. Give at most one; with neither,
      ``coverage=0.9``. :math:`\tau` carries no gradient.
    * Gradients: the counts :math:`h_k` are constants; the weight of a sample
      below :math:`\tau` is differentiated through its own score inside the
      sigmoids, the weight above :math:`\tau` is constant — the gradient of
      App. C.4, Eq. (27) of [1]. Its first term,
      :math:`(\nabla\hat\beta_i)\,\ell_i`, lowers the score of every sample
      below :math:`\tau` in proportion to its loss. ``weight_grad=False`` drops
      it (the weights become constants, as in :func:`aurc` and the
      ``weight_grad`` switch of the authors' AURC loss), leaving
      :math:`\hat\beta_i\nabla\ell_i`.
    * ``1 - Ĝ`` is evaluated in log space, so weights stay finite even where the
      sigmoids saturate (no epsilon).

    Training dynamics. The equations are implemented as written, and with them
    training from scratch can collapse: the first term of Eq. (27) pushes the
    score of every sample below :math:`\tau` down in proportion to its loss,
    and with the Eq. (16) weights near-uniform outputs (all scores near
    :math:`1/K`) attract every sample once
    :math:`\nu < \ln K / (2K\ln 2)` (about 0.17 for K = 10, 0.017 for
    K = 100). Measured in the digits benchmark (``make demo``: MLP from
    scratch, AdamW, 30 epochs, ``coverage=0.9``, 3 seeds, mean ± SEM): test
    accuracy 36 ± 10% with Eq. (27) and ``nu=0.1``. What trains:

    * ``variant='released_code'``: its score is taken on
      :math:`\mathrm{softmax}(\mathrm{softmax}(z))`, which squeezes it into
      :math:`[1/K, e/(e + K - 1)]` and shrinks the weight-gradient term about
      10x; this is what reproduces the paper's tables (97.8 ± 0.2% on digits
      with 64 bins and ``nu=0.05``, the benchmark's ``au_pxtau_released``);
    * ``weight_grad=False`` (constant weights; 97.6 ± 0.5% on digits);
    * a larger :math:`\nu`, at or above :math:`\ln K / (2K\ln 2)`;
    * starting from a cross-entropy model, whose scores already sit far from
      :math:`1/K` (fine-tuning, as in [1]'s pretrained settings).

    Running histogram: with ``hist=None`` the CDF is this batch's histogram.
    Algorithm 1 of [1] instead updates :math:`\hat G_\nu` with each batch's
    scores before weighting; to do that, keep a float ``[num_bins]`` state,
    update it with :func:`au_pxtau_update_hist` *first* and pass the result as
    ``hist`` (the normaliser :math:`n` of Eq. (15) is then ``sum(hist)``; the
    mean of Eq. (17) stays over this batch). Both functions are pure.

    Defaults: ``nu=0.1`` (App. E.2: CIFAR-10, and WRN on CIFAR-100),
    ``coverage=0.9`` (the most frequent CIFAR entry of App. Table 3),
    ``num_bins=15`` (the paper does not state its bin count).

    ``variant='released_code'`` computes the authors' loss (repository
    han678/CalibWeightedRisk, file ``loss/selectAU.py``, class
    ``SelectiveAULoss``, with ``loss/hist_rank.py`` for the CDF and
    ``loss/aurc.py`` for the scores; ``reduction='mean'``). Differences from
    the paper, one per line:

    * the score is taken on :math:`s = \mathrm{clamp}(\mathrm{softmax}(z), 10^{-9}, 1 - 10^{-9})` passed through a second softmax (MSP and margin of :math:`\mathrm{softmax}(s)`);
    * ``csf='neg_entropy'`` is :math:`\sum_k s_k\log s_k` normalised as :math:`\mathrm{clamp}((g - \ln K)/(0 - \ln K), 0, 1)`, which is 1 for every :math:`g \le 0`: all weights equal, no weight gradient;
    * the bins are ``num_bins`` equal-width bins on [0, 1] for every CSF;
    * the CDF weights each bin by :math:`\max(h_k, 10^{-12})` over :math:`\max(n, 10^{-12})` (empty bins still count a little);
    * :math:`\tau` is the ``coverage``-quantile of this batch's scores (``torch.quantile``, linear), not of the histogram, and it carries gradient (to the two scores it interpolates, stable order on ties);
    * :math:`\hat G(g_i)` and :math:`\hat G(\tau)` are clamped to :math:`[1/(B+1), B/(B+1)]` (no gradient outside), :math:`B` the number of unmasked rows;
    * ``1 - Ĝ`` is evaluated directly, not in log space;
    * the histogram is a running state: the training script (``src/train.py``) adds each batch before weighting and clears it after every epoch (``hist_cdf.clear()``); here that is ``hist`` updated with ``au_pxtau_update_hist(..., variant='released_code')`` and reset to zeros each epoch (``hist=None`` is the first batch after a reset);
    * no explicit ``tau`` and no ``weight_grad=False`` (both raise a ValueError).

    The released defaults are ``num_bins=64`` and ``nu=0.05`` (``hist_sigma``)
    and a quantile of 0.5 (0.25 from its command line, 0.4 in its Tiny-ImageNet
    configs); this function keeps its own defaults for both variants.

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      num_bins: static int, number of histogram bins :math:`M` (Eq. (13)).
      nu: sigmoid smoothing :math:`\nu > 0` of Eq. (15).
      tau: optional low-confidence threshold on the CSF's scale (Eq. (16)).
      coverage: optional fraction in (0, 1] defining ``tau`` (App. E.2).
      csf: static str, ``'msp'``, ``'neg_entropy'`` or ``'softmax_margin'``.
      hist: optional float ``[num_bins]`` running counts (see above).
      weight_grad: static bool; ``False`` stops the gradient through the
        weights (see Gradients above). The value is the same either way.
      variant: static str, ``'paper'`` (Eqs. (13)-(17) of [1]) or
        ``'released_code'`` (the authors' code, see above).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch; global-batch semantics under
      data-sharded jit (the histogram spans all devices).

    Raises:
      ValueError: ``nu <= 0``, ``num_bins < 1``, ``coverage`` outside (0, 1],
        both ``tau`` and ``coverage`` given, an unknown ``csf`` or
        ``variant``, a ``hist`` of the wrong shape, or
        ``variant='released_code'`` with ``tau`` or ``weight_grad=False``.

    References:
      [1] H. Zhou, S. G. Gruber, T. Popordanoska, M. B. Blaschko, "Revisiting
      Reweighted Risk for Calibration: AURC, Focal and Inverse Focal Loss", 2025,
      Eqs. (13)–(17), Algorithm 1, App. C.4 and E.2. Code:
      github.com/han678/CalibWeightedRisk, ``loss/selectAU.py``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(au_pxtau(logits, jnp.array([0, 0, 0, 0]))):.4f}")
      0.2382
    """
    num_bins, coverage, csf = _check_au_args(
        num_bins, nu, tau, coverage, csf, hist, variant
    )
    weight_grad = check_bool("weight_grad", weight_grad)
    if variant == "released_code" and not weight_grad:
        reject("au_pxtau", "weight_grad=False")
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
        logits,
        mask,
        num_bins=num_bins,
        nu=nu,
        tau=tau,
        coverage=coverage,
        csf=csf,
        hist=hist,
        rows=rows,
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

    ``au_pxtau(logits, labels, **kw)`` equals the masked mean of
    ``au_pxtau_weights(logits, **kw) * cross_entropy``. Useful to inspect the
    weighting (all samples with score at or above :math:`\tau` share one weight).

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
    num_bins, coverage, csf = _check_au_args(
        num_bins, nu, tau, coverage, csf, hist, variant
    )
    weight_grad = check_bool("weight_grad", weight_grad)
    if variant == "released_code" and not weight_grad:
        reject("au_pxtau_weights", "weight_grad=False")
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
        logits,
        mask,
        num_bins=num_bins,
        nu=nu,
        tau=tau,
        coverage=coverage,
        csf=csf,
        hist=hist,
    )
    return beta if weight_grad else lax.stop_gradient(beta)


def _released_counts(score, mask, hist, num_bins):
    """The counts the released CDF uses: ``hist`` (already updated with this
    batch, as ``SelectiveAULoss.forward`` adds before it weights) or, without
    a running state, this batch's own histogram."""
    if hist is None:
        return histogram(score, mask, au_edges(num_bins, score.dtype))
    return lax.stop_gradient(jnp.asarray(hist, score.dtype))


@functools.partial(jax.jit, static_argnames=("num_bins", "csf"))
def _au_pxtau_released(logits, labels, mask, nu, coverage, hist, *, num_bins, csf):
    logits = zero_excluded_logits(logits, mask)
    ce = row_stats(logits, labels, ce=True).ce
    score = au_score(logits, csf)
    counts = _released_counts(score, mask, hist, num_bins)
    alpha = _released_weights(score, mask, counts, nu, coverage, num_bins=num_bins)
    return masked_mean(alpha * ce, mask)


@functools.partial(jax.jit, static_argnames=("num_bins", "csf"))
def _au_pxtau_released_weights(logits, mask, nu, coverage, hist, *, num_bins, csf):
    logits = zero_excluded_logits(logits, mask)
    score = au_score(logits, csf)
    counts = _released_counts(score, mask, hist, num_bins)
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
