r"""The metrics every report shows, in one call: :func:`summary` over the one list
:data:`SUMMARY_METRICS` (trainer, post-hoc CLI and benchmark read it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax

from calib_jax import _checks, metrics
from calib_jax.metrics import _inputs, _validate


class SummaryMetric(NamedTuple):
    """One entry of :data:`SUMMARY_METRICS`.

    Attributes:
      key: the key of the value in :func:`summary`'s dict (and in the
        benchmark's result rows).
      description: the metric and its convention, as report headers name it.
      column: a short column name for fixed-width tables.
      metric: the registry name of the function (:data:`calib_jax.metrics.METRICS`).
      options: keyword options of the function other than ``num_bins``.
      binned: whether the function takes ``num_bins``.
    """

    key: str
    description: str
    column: str
    metric: str
    options: tuple[tuple[str, object], ...] = ()
    binned: bool = False


# The order is the order of evaluation (and of the benchmark report's columns).
SUMMARY_METRICS: dict[str, SummaryMetric] = {
    m.key: m
    for m in (
        SummaryMetric("accuracy", "top-1 accuracy", "acc", "accuracy"),
        SummaryMetric(
            "ece_l2_em",
            "ECE, 15 equal-mass bins, l2 (soft-calibration paper)",
            "ece_l2_em",
            "ece",
            (("binning", "equal_mass"), ("p", 2)),
            binned=True,
        ),
        SummaryMetric(
            "ece",
            "ECE, 15 equal-width bins, l1 (Guo et al.; focal/ACLS papers)",
            "ece",
            "ece",
            binned=True,
        ),
        SummaryMetric(
            "adaptive_ece",
            "adaptive ECE, 15 equal-mass bins, l1",
            "ada_ece",
            "adaptive_ece",
            binned=True,
        ),
        SummaryMetric(
            "classwise_ece",
            "classwise ECE, 15 equal-width bins, l1",
            "cw_ece",
            "classwise_ece",
            binned=True,
        ),
        SummaryMetric("ks_error", "KS error (Gupta et al. 2021)", "ks", "ks_error"),
        SummaryMetric("brier", "Brier score", "brier", "brier"),
        SummaryMetric("nll", "negative log-likelihood", "nll", "nll"),
        SummaryMetric("aurc", "AURC (maximum softmax probability)", "aurc", "aurc"),
    )
}

# The metrics of every evaluation set of a run and of the post-hoc CLI's tables.
SPLIT_METRICS = ("accuracy", "nll", "ece", "adaptive_ece", "classwise_ece", "brier")


def summary_functions(
    num_bins: int = 15, *, from_logits: bool = False
) -> dict[str, Callable]:
    """``{key: fn(probs, labels, *, where=None)}`` of every :data:`SUMMARY_METRICS` key.

    Cached, so callers that key a compilation on them get the same objects.
    """
    return _functions(num_bins, _checks.check_bool("from_logits", from_logits))


@functools.cache
def _functions(num_bins, from_logits):
    out = {}
    for key, m in SUMMARY_METRICS.items():
        fn = metrics.get_metric(m.metric)
        options = dict(m.options, **({"num_bins": num_bins} if m.binned else {}))
        if from_logits:
            options["from_logits"] = True
        out[key] = functools.partial(fn, **options) if options else fn
    return out


def check_names(names: Sequence[str], what: str = "names") -> tuple[str, ...]:
    """``names`` as a tuple; ValueError naming any that is not a summary key."""
    names = tuple(names)
    unknown = [n for n in names if n not in SUMMARY_METRICS]
    if unknown:
        raise ValueError(
            f"{what} has unknown metric(s) {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(SUMMARY_METRICS)}."
        )
    return names


def summary(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    names: Sequence[str] | None = None,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> dict[str, jax.Array]:
    r"""The reported metrics of one evaluation set, as a dict.

    Every value is the public metric of :data:`SUMMARY_METRICS` with its
    convention, so ``summary(p, y)["ece"]`` is ``metrics.ece(p, y)`` bit for
    bit (one program, one transfer). With
    :math:`c_i = \max_k p_{ik}`, :math:`\hat y_i` the first arg-max and bins
    :math:`B_m`:

    - ``accuracy``: :math:`\frac1N\sum_i [\hat y_i = y_i]`;
    - ``ece`` (equal-width bins, :math:`\ell_1`, Eq. (3) of [1]) and
      ``ece_l2_em`` (equal-mass bins, :math:`\ell_2`, the convention of [2]):
      :math:`\big(\sum_m \frac{|B_m|}{N} |\mathrm{acc}(B_m) -
      \mathrm{conf}(B_m)|^p\big)^{1/p}`;
    - ``adaptive_ece``: the :math:`\ell_1` ECE with equal-mass bins [3];
    - ``classwise_ece``: the mean over classes of the equal-width ECE of
      :math:`p_{ik}` against :math:`[y_i = k]` (Def. A.1, Eq. (18) of [4]);
    - ``ks_error``: :math:`\max_\sigma |\frac1N\sum_{j:\,c_j \le \sigma}
      ([\hat y_j = y_j] - c_j)|` over the distinct confidences :math:`\sigma`
      [5];
    - ``brier``: :math:`\frac1N\sum_i\sum_k (p_{ik} - [y_i = k])^2` (Def. A.2,
      Eq. (19) of [4]);
    - ``nll``: :math:`-\frac1N\sum_i \log \max(p_{iy_i}, t)`, :math:`t` the
      smallest normal float;
    - ``aurc``: the area under the risk-coverage curve of the maximum
      softmax probability (Def. 3.3 of [4]; [6]).

    Args:
      probs: float ``[N, K]`` rows on the probability simplex, ``[N, K]``
        logits with ``from_logits``, or top-label rows (see ``from_logits``).
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      num_bins: bins of the binned metrics (static under ``jax.jit``).
      names: the keys to compute, in the returned order (default: every key
        of :data:`SUMMARY_METRICS`, in its order).
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool, ``probs`` holds ``[N, K]`` logits (bf16, fp16
        or float32; ``docs/metrics.md``, "Logits and top-label rows in"). A
        :class:`~calib_jax.metrics.TopLabelRows` serves the top-label names only.

    Returns:
      ``{key: float32 scalar}``. Jittable (``num_bins`` and ``names``
      static) and vmappable over leading axes of ``probs``, ``labels`` and
      ``where``.

    Raises:
      ValueError: an unknown name, or (eagerly) the inputs fail a metric's
        checks.

    References:
      [1] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017, arXiv:1706.04599v2, Eq. (3).
      [2] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021 (ECE with 15 equal-mass bins, l2, Table 2).
      [3] J. Nixon et al., "Measuring Calibration in Deep Learning", CVPR
      Workshops 2019 (adaptive calibration error).
      [4] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss".
      [5] K. Gupta et al., "Calibration of Neural Networks using Splines",
      ICLR 2021 (KS calibration error).
      [6] Y. Geifman, G. Uziel, R. El-Yaniv, "Bias-Reduced Uncertainty
      Estimation for Deep Neural Classifiers", ICLR 2019 (AURC).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> out = metrics.summary(probs, labels, names=("accuracy", "brier"))
      >>> print({k: round(float(v), 3) for k, v in out.items()})
      {'accuracy': 0.75, 'brier': 0.35}
    """
    names = check_names(tuple(SUMMARY_METRICS) if names is None else names)
    form = _inputs.input_form(probs, labels, from_logits=from_logits, metric="summary")
    if form != _inputs.PROBS:
        # Logits or top-label rows, checked in the one compiled call.
        x, labels, where = _inputs.checked(probs, labels, where, form)
        logits = form == _inputs.LOGITS
        static = (names, int(num_bins), logits)
        values = _inputs.evaluate(_core, form, x, labels, where, *static)
        return dict(zip(names, values))
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    values = _validate.evaluate(_core, probs, labels, where, names, int(num_bins))
    return dict(zip(names, values))


def _core(probs, labels, where, names, num_bins, from_logits=False):
    functions = summary_functions(num_bins, from_logits=from_logits)
    if where is None:  # the metrics exactly as called without a mask
        return tuple(functions[k](probs, labels) for k in names)
    return tuple(functions[k](probs, labels, where=where) for k in names)
