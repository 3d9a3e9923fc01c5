"""Statistical tests of calibration: Spiegelhalter's Z and ECE consistency."""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax
from jax.scipy.special import ndtr

from calib_jax import _checks
from calib_jax.metrics import _common, _conventions, _kernels, _validate

MODES = ("top_label", "binary")

# Elements (draws x rows) of one vmapped block of the consistency test.
_DRAW_ELEMENTS = 1 << 22


class CalibrationTest(NamedTuple):
    """A test statistic and its p-value (float32 scalars).

    Attributes:
      statistic: the test statistic (Spiegelhalter's Z, or the observed ECE).
      p_value: the p-value under the null hypothesis of perfect calibration.
    """

    statistic: jax.Array
    p_value: jax.Array


def check_mode(mode: str, num_classes: int) -> str:
    """``mode`` if valid for ``K = num_classes``; one-line ValueError else."""
    _checks.check_choice("mode", mode, MODES)
    if mode == "binary" and num_classes != 2:
        raise ValueError(
            f"mode='binary' needs probs with K = 2 columns (got K = {num_classes}); "
            f"use mode='top_label' for K > 2 (mode must be one of {MODES})."
        )
    return mode


def forecast_outcome(probs, labels, mode):
    """The forecast ``x [N]`` (float) and the event ``o [N]`` (bool) of ``mode``:
    (top-label confidence, correct) or (probability of class 1, label == 1)."""
    if mode == "top_label":
        return _common.top_label(probs, labels)
    return _common.as_float(probs)[:, 1], labels == 1


@struct.dataclass
class SpiegelhalterStats:
    r"""Mergeable sums of Spiegelhalter's Z test.

    The sums of batches (or of the shards of a global batch) add, and
    :meth:`compute` divides once: a split tested in batches gives the
    one-shot value up to float32 summation order.

    Attributes:
      numerator: float32 scalar, :math:`\sum_i (o_i - x_i)(1 - 2x_i)`.
      variance: float32 scalar, :math:`\sum_i (1 - 2x_i)^2 x_i (1 - x_i)`.
      total: int32 scalar, the number of included rows.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax.metrics import SpiegelhalterStats
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([1, 0, 0, 1])
      >>> a = SpiegelhalterStats.from_batch(probs[:2], labels[:2])
      >>> b = SpiegelhalterStats.from_batch(probs[2:], labels[2:])
      >>> print(f"{float(a.merge(b).compute().statistic):.4f}")
      2.0101
    """

    numerator: jax.Array
    variance: jax.Array
    total: jax.Array

    @classmethod
    def empty(cls) -> SpiegelhalterStats:
        """All-zero sums (the identity of :meth:`merge`)."""
        zero = jnp.zeros((), jnp.float32)
        return cls(numerator=zero, variance=zero, total=jnp.zeros((), jnp.int32))

    @classmethod
    def from_batch(
        cls,
        probs: jax.typing.ArrayLike,
        labels: jax.typing.ArrayLike,
        *,
        mode: str = "top_label",
        where: jax.typing.ArrayLike | None = None,
    ) -> SpiegelhalterStats:
        """The sums of one batch ``probs [N, K]``, ``labels [N]`` (args as
        :func:`spiegelhalter_test`)."""
        probs, labels, where = _validate.check_probs_labels(
            probs, labels, where, values=False
        )
        check_mode(mode, probs.shape[1])
        return _validate.evaluate(_spiegelhalter_sums, probs, labels, where, mode)

    def merge(self, other: SpiegelhalterStats) -> SpiegelhalterStats:
        """The sums of both (``+`` does the same)."""
        return SpiegelhalterStats(
            numerator=self.numerator + other.numerator,
            variance=self.variance + other.variance,
            total=self.total + other.total,
        )

    __add__ = merge

    def compute(self) -> CalibrationTest:
        """Z and its two-sided p-value (see :func:`spiegelhalter_test`)."""
        return spiegelhalter_from_sums(self.numerator, self.variance)


def spiegelhalter_from_sums(numerator, variance) -> CalibrationTest:
    """``Z = numerator / sqrt(variance)`` and ``2 (1 - Phi(|Z|))``; a zero
    variance gives ``Z = 0`` for a zero numerator, else ``+inf`` (always +)."""
    numerator = jnp.asarray(numerator, jnp.float32)
    variance = jnp.asarray(variance, jnp.float32)
    degenerate = variance <= 0
    safe = jnp.where(degenerate, 1.0, variance)
    z = jnp.where(
        degenerate,
        jnp.where(numerator == 0, 0.0, jnp.sign(numerator) * jnp.inf),
        numerator / jnp.sqrt(safe),
    )
    return CalibrationTest(statistic=z, p_value=2.0 * ndtr(-jnp.abs(z)))


@functools.partial(jax.jit, static_argnums=3)
def _spiegelhalter_sums(probs, labels, where, mode):
    x, o = forecast_outcome(probs, labels, mode)
    valid = _common.mask_or_ones(where, x.shape[0])
    w = 1.0 - 2.0 * x
    numerator = jnp.where(valid, (o.astype(x.dtype) - x) * w, 0.0)
    variance = jnp.where(valid, w * w * x * (1.0 - x), 0.0)
    return SpiegelhalterStats(
        numerator=jnp.sum(numerator).astype(jnp.float32),
        variance=jnp.sum(variance).astype(jnp.float32),
        total=jnp.sum(valid.astype(jnp.int32)),
    )


@functools.partial(jax.jit, static_argnums=3)
def _spiegelhalter_core(probs, labels, where, mode):
    return _spiegelhalter_sums(probs, labels, where, mode).compute()


def spiegelhalter_test(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    mode: str = "top_label",
    where: jax.typing.ArrayLike | None = None,
) -> CalibrationTest:
    r"""Spiegelhalter's Z test of calibration (batch-level, two-sided).

    With forecasts :math:`x_i` and events :math:`o_i \in \{0, 1\}`
    (``mode='top_label'``: the top-label confidence and whether the
    prediction is correct; ``mode='binary'``: :math:`p_{i1}` and
    :math:`[y_i = 1]`), the statistic of [1] standardises the
    Brier score's deviation from its expectation under calibration:

    .. math::

        Z = \frac{\sum_i (o_i - x_i)(1 - 2x_i)}
        {\sqrt{\sum_i (1 - 2x_i)^2\, x_i (1 - x_i)}},
        \qquad p = 2\,(1 - \Phi(|Z|)),

    asymptotically standard normal when :math:`o_i \sim
    \mathrm{Bernoulli}(x_i)`. ``Z > 0`` means forecasts too far from 1/2
    (overconfident), ``Z < 0`` too close to it (underconfident). The p-value
    is two-sided (MAPIE's ``spiegelhalter_p_value`` reports the one-sided
    :math:`1 - \Phi(Z)`). A zero denominator (every forecast 0, 1/2 or 1)
    gives ``Z = 0, p = 1`` when the numerator is 0 and ``Z = +inf, p = 0``
    otherwise. :class:`SpiegelhalterStats` is the mergeable form.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex (not logits).
      labels: int ``[N]`` class ids in ``[0, K)``.
      mode: ``'top_label'`` (any K) or ``'binary'`` (K = 2).
      where: optional bool ``[N]``; ``False`` rows (padding) are excluded.

    Returns:
      :class:`CalibrationTest` of float32 scalars; global-batch value under a
      data-sharded ``jax.jit``.

    References:
      [1] D. J. Spiegelhalter, "Probabilistic prediction in patient
      management and clinical trials", Statistics in Medicine 5(5):421-433,
      1986 (the Z statistic of the Brier score).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([1, 0, 0, 1])
      >>> z, p = metrics.spiegelhalter_test(probs, labels, mode="binary")
      >>> print(f"{float(z):.4f} {float(p):.4f}")
      2.0101 0.0444
    """
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    check_mode(mode, probs.shape[1])
    return _validate.evaluate(_spiegelhalter_core, probs, labels, where, mode)


def _ece_of(conf, correct, valid, count, num_bins, convention):
    """Equal-width top-label ECE (the fast path of :func:`metrics.ece`)."""
    bins = _conventions.bin_index(conf, num_bins, convention)
    slots = _conventions.num_slots(convention, num_bins)
    gaps = _kernels.gap_sums_top_label(conf, correct, bins, valid, slots)
    return jnp.sum(jnp.abs(gaps)) / count.astype(gaps.dtype)


def consistency_draws(conf, valid, key, num_samples, num_bins):
    """Float ``[num_samples]`` ECEs of surrogate datasets: the included
    confidences resampled with replacement, each outcome
    ``Bernoulli(confidence)``."""
    n = conf.shape[0]
    convention = _conventions.get_convention(_conventions.DEFAULT)
    count = jnp.maximum(jnp.sum(valid.astype(jnp.int32)), 1)
    # Included row positions first; a uniform index below `count` picks one.
    rows = jnp.nonzero(valid, size=n, fill_value=0)[0]

    def draw(k):
        k_rows, k_outcome = jax.random.split(k)
        idx = rows[jax.random.randint(k_rows, (n,), 0, count)]
        c = conf[idx]
        outcome = jax.random.uniform(k_outcome, (n,), c.dtype) < c
        return _ece_of(c, outcome, valid, count, num_bins, convention)

    keys = jax.random.split(key, num_samples)
    block = max(1, _DRAW_ELEMENTS // max(n, 1))
    if block >= num_samples:
        return jax.vmap(draw)(keys)
    return lax.map(draw, keys, batch_size=block)


@functools.partial(jax.jit, static_argnums=(4, 5))
def _consistency_core(probs, labels, where, key, num_samples, num_bins):
    conf, correct = _common.top_label(probs, labels)
    valid = _common.mask_or_ones(where, conf.shape[0])
    convention = _conventions.get_convention(_conventions.DEFAULT)
    count = jnp.maximum(jnp.sum(valid.astype(jnp.int32)), 1)
    observed = _ece_of(conf, correct, valid, count, num_bins, convention)
    draws = consistency_draws(conf, valid, key, num_samples, num_bins)
    exceed = jnp.sum((draws >= observed).astype(jnp.int32))
    p_value = (1.0 + exceed.astype(jnp.float32)) / (1.0 + num_samples)
    return CalibrationTest(statistic=observed.astype(jnp.float32), p_value=p_value)


def _check_key(key) -> jax.Array:
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if not (typed and key.shape == ()) and not (
        key.dtype == jnp.uint32 and key.shape == (2,)
    ):
        raise ValueError(
            "key must be one PRNG key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got dtype {key.dtype} shape {key.shape}."
        )
    return key


def ece_consistency_test(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    key: jax.Array,
    num_samples: int = 1000,
    num_bins: int = 15,
    where: jax.typing.ArrayLike | None = None,
) -> CalibrationTest:
    r"""Consistency-resampling test of the equal-width top-label ECE.

    Consistency resampling [1] (Sec. 3) estimates the distribution of a
    reliability statistic under perfect calibration: each of ``num_samples``
    surrogate datasets resamples the observed top-label confidences
    :math:`c_i` with replacement and draws each outcome
    :math:`\tilde a_i \sim \mathrm{Bernoulli}(\tilde c_i)`; its ECE
    (:func:`~calib_jax.metrics.ece`, equal-width bins, default convention)
    is one draw. The statistic is the observed ECE and the one-sided
    p-value counts the observed value itself (so it is never 0):

    .. math::

        p = \frac{1 + \#\{s : \mathrm{ECE}^{(s)} \ge \mathrm{ECE}\}}
        {1 + S}, \qquad S = \text{num\_samples}.

    The draws depend only on ``key``. Not mergeable across batches: the
    draws resample the whole split (concatenate the batches first).

    Args:
      probs: float ``[N, K]`` rows on the probability simplex (not logits).
      labels: int ``[N]`` class ids in ``[0, K)``.
      key: a PRNG key (``jax.random.key`` or ``jax.random.PRNGKey``).
      num_samples: static int ``S >= 1``, the number of surrogate datasets.
      num_bins: static int ``M >= 1`` (as :func:`~calib_jax.metrics.ece`).
      where: optional bool ``[N]``; ``False`` rows are excluded from the ECE
        and from the resampling.

    Returns:
      :class:`CalibrationTest`: the observed ECE and the p-value (float32).

    References:
      [1] J. Bröcker, L. A. Smith, "Increasing the Reliability of Reliability
      Diagrams", Weather and Forecasting 22(3):651-661, 2007, Sec. 3
      (consistency resampling).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> t = metrics.ece_consistency_test(
      ...     probs, labels, key=jax.random.key(0), num_samples=99, num_bins=5)
      >>> print(f"{float(t.statistic):.3f}", 0 < float(t.p_value) <= 1)
      0.150 True
    """
    m = _checks.check_num_bins(num_bins)
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise ValueError(  # noqa: TRY004 (every bad count is a ValueError)
            f"num_samples must be a Python int >= 1, got {num_samples!r}."
        )
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    key = _check_key(key)
    return _validate.evaluate(
        _consistency_core, probs, labels, where, int(num_samples), m, operands=(key,)
    )
