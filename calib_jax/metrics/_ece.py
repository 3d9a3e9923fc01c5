r"""Top-label binned calibration errors: ECE, RMSCE, MCE and reliability bins."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.metrics import (
    _adaptive,
    _binned_stats,
    _common,
    _conventions,
    _inputs,
    _kernels,
    _validate,
)

BINNINGS = ("equal_width", "equal_mass")


def _options(num_bins, binning, convention):
    conv = _conventions.get_convention(convention)
    m = _checks.check_num_bins(num_bins)
    _checks.check_choice("binning", binning, BINNINGS)
    if binning == "equal_mass":
        _adaptive.check_equal_mass(conv)
    return m, conv


def _fast_path(binning, convention, p):
    """Whether the ECE needs only ``sum(conf - correct)`` per bin."""
    return binning == "equal_width" and p == 1 and convention.min_count == 1


def _rows_error(conf, correct, where, num_bins, binning, convention, p):
    """The top-label binned error of rows ``(conf, correct)`` (traceable)."""
    valid = _common.mask_or_ones(where, conf.shape[0])
    if _fast_path(binning, convention, p):
        bins = _conventions.bin_index(conf, num_bins, convention)
        slots = _conventions.num_slots(convention, num_bins)
        gaps = _kernels.gap_sums_top_label(conf, correct, bins, valid, slots)
        n = jnp.maximum(jnp.sum(valid.astype(jnp.int32)), 1).astype(gaps.dtype)
        return jnp.sum(jnp.abs(gaps)) / n
    if binning == "equal_width":
        stats = _binned_stats.stats_from_confidences(
            conf, correct, valid, num_bins, convention
        )
        return _binned_stats.stats_error(stats, p)
    return _adaptive.equal_mass_rows_error(
        conf, correct, valid, num_bins, convention, p
    )


_rows_core = jax.jit(_rows_error, static_argnums=(3, 4, 5, 6))


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def _top_label_core(
    probs, labels, where, num_bins, binning, convention, p, screen=False
):
    """The top-label binned error; with ``screen`` also the value screen's row
    sums (``None`` on the equal-width path that needs more than the gaps)."""
    sums = None
    if screen and (binning != "equal_width" or _fast_path(binning, convention, p)):
        conf, correct, sums = _common.top_label(probs, labels, screen=True)
    else:
        conf, correct = _common.top_label(probs, labels)
    out = _rows_error(conf, correct, where, num_bins, binning, convention, p)
    return (out, sums) if screen else out


def _top_label_error(
    probs, labels, where, num_bins, binning, convention, p, from_logits, metric
):
    m, conv = _options(num_bins, binning, convention)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric=metric
    )
    if rows is not None:
        (conf, correct), where = rows
        return _rows_core(conf, correct, where, m, binning, conv, p)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(
        _top_label_core, probs, labels, where, m, binning, conv, p, screened=True
    )


def ece(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    p: float = 1,
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Expected calibration error of the top-label confidence (binned).

    The binned estimator of Def. 3.6 of [1] (Naeini et al. 2015; Guo et al.
    2017), with confidence :math:`c_i = \max_k p_{ik}` and correctness
    :math:`a_i = [\operatorname{argmax}_k p_{ik} = y_i]` (ties go to the first
    maximal class, as ``np.argmax``):

    .. math::

        \mathrm{ECE}_p = \Big(\sum_{b} \frac{n_b}{N}
        |\mathrm{acc}_b - \mathrm{conf}_b|^p\Big)^{1/p},
        \quad \mathrm{acc}_b = \frac{1}{n_b}\sum_{i \in b} a_i,\
        \mathrm{conf}_b = \frac{1}{n_b}\sum_{i \in b} c_i .

    ``p=2`` takes the root after the weighted mean (RMSCE). Bin edges, the
    side of an edge a confidence goes to, the bins of exactly 0 and 1.0 and
    sparse-bin handling follow ``convention`` (``docs/metrics.md``). The
    default puts 1.0 in the last bin and 0 in the first, bins ``[lo, hi)``,
    and skips empty bins, so it never returns NaN. ``binning='equal_mass'``
    is :func:`adaptive_ece`.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      num_bins: static int ``M >= 1``.
      binning: ``'equal_width'`` or ``'equal_mass'``.
      p: 1 or 2.
      convention: a name in :data:`~calib_jax.metrics.PRESETS` or a
        :class:`~calib_jax.metrics.Convention`.
      where: optional bool ``[N]``; ``False`` rows (padding) are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar; global-batch value under a data-sharded ``jax.jit``.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. 3.6.
      [2] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017, arXiv:1706.04599v2, Eq. (3).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.ece(probs, labels, num_bins=5)):.3f}")
      0.150
    """
    p = _validate.check_p(p)
    return _top_label_error(
        probs, labels, where, num_bins, binning, convention, p, from_logits, "ece"
    )


def rmsce(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Root-mean-square calibration error, ``ece(..., p=2)``.

    .. math::

        \mathrm{RMSCE} = \Big(\sum_b \frac{n_b}{N}
        (\mathrm{acc}_b - \mathrm{conf}_b)^2\Big)^{1/2}.

    Args and Returns as :func:`ece`.

    References:
      [1] A. Kumar, P. Liang, T. Ma, "Verified Uncertainty Calibration",
      NeurIPS 2019 (the l2 calibration error).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.rmsce(probs, labels, num_bins=5)):.3f}")
      0.150
    """
    return _top_label_error(
        probs, labels, where, num_bins, binning, convention, 2.0, from_logits, "rmsce"
    )


def mce(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Maximum calibration error: the largest gap over non-empty bins.

    .. math::

        \mathrm{MCE} = \max_{b:\, n_b \ge n_{\min}}
        |\mathrm{acc}_b - \mathrm{conf}_b| ,

    Eq. (5) of [1]; :math:`n_{\min}` is ``convention.min_count`` (1: empty
    bins are skipped).

    Args and Returns as :func:`ece`.

    References:
      [1] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017, arXiv:1706.04599v2, Eq. (5).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.mce(probs, labels, num_bins=5)):.3f}")
      0.150
    """
    return _top_label_error(
        probs,
        labels,
        where,
        num_bins,
        binning,
        convention,
        float("inf"),
        from_logits,
        "mce",
    )


def _reliability_rows(conf, correct, where, num_bins, binning, convention):
    valid = _common.mask_or_ones(where, conf.shape[0])
    if binning == "equal_width":
        return _binned_stats.stats_from_confidences(
            conf, correct, valid, num_bins, convention
        ).reliability()
    count, sum_conf, sum_correct, _, lower, upper = _adaptive.equal_mass_stats(
        conf, correct, valid, num_bins, convention.equal_mass
    )
    safe = jnp.maximum(count, 1).astype(jnp.float32)
    return {
        "count": count,
        "confidence": sum_conf / safe,
        "accuracy": sum_correct.astype(jnp.float32) / safe,
        "lower": lower,
        "upper": upper,
    }


_reliability_rows_core = jax.jit(_reliability_rows, static_argnums=(3, 4, 5))


_reliability_core = jax.jit(
    _inputs.on_probs(_reliability_rows), static_argnums=(3, 4, 5)
)


def reliability_bins(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    convention: str | _conventions.Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> dict[str, jax.Array]:
    r"""Per-bin data of a reliability diagram.

    Returns a dict of ``[S]`` arrays: ``count`` (int32 samples per bin),
    ``confidence`` (mean top-label confidence), ``accuracy`` (fraction
    correct), ``lower`` and ``upper`` (bin edges; for equal-mass bins the
    smallest and largest confidence in the bin). Empty bins report 0 for
    confidence and accuracy; mask them with ``count``. ``S = num_bins`` except
    for ``convention='torchmetrics'``, whose extra bin ``[1, 1]`` holds the
    confidences equal to 1.0.

    Args as :func:`ece`.

    References:
      [1] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017, arXiv:1706.04599v2, Sec. 2 (reliability diagrams).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> bins = metrics.reliability_bins(probs, labels, num_bins=5)
      >>> print(bins["count"].tolist(), bins["accuracy"].tolist())
      [0, 0, 0, 2, 2] [0.0, 0.0, 0.0, 0.5, 1.0]
    """
    m, conv = _options(num_bins, binning, convention)
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="reliability_bins"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _reliability_rows_core(conf, correct, where, m, binning, conv)
    probs, labels, where = _validate.check_probs_labels(probs, labels, where)
    return _reliability_core(probs, labels, where, m, binning, conv)
