"""Mergeable binned sufficient statistics: :class:`BinnedStats`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from calib_jax import _checks, kernels
from calib_jax.metrics import (
    _common,
    _conventions,
    _cpu_kernels,
    _exact_sums,
    _kernels,
    _validate,
)
from calib_jax.metrics._conventions import Convention


@struct.dataclass
class BinnedStats:
    r"""Per-bin sufficient statistics of equal-width binned calibration errors.

    Build one per batch with :meth:`from_batch`, combine with :meth:`merge`
    (or ``+``), and call :meth:`compute` once at the end. All arrays are
    plain sums (a data-sharded ``jax.jit`` sums the global batch); counts are
    exact, so a merged value equals the one-shot value up to float32
    summation order of the confidence sums (~1e-7 relative). With
    ``exact_sums=True`` the confidence sums are kept exactly (integer limbs)
    and ``sum_conf`` is their correctly rounded float32: any split into
    batches, devices or processes, merged, gives the one-shot statistics bit
    for bit (``docs/metrics.md``, "Exact sums").

    Attributes:
      count: int32 ``[S]`` (``[K, S]`` class-wise) samples per bin.
      sum_conf: float ``[S]`` / ``[K, S]`` sum of confidences per bin.
      sum_correct: int32 ``[S]`` / ``[K, S]`` correct predictions per bin
        (class-wise: samples whose label is the class).
      total: int32 scalar, number of included samples ``N`` (also those a
        convention drops from every bin).
      num_bins: static ``M``; ``S = M`` or ``M + 1`` (``top='extra'``).
      convention: static :class:`~calib_jax.metrics.Convention`.
      classwise: static, True for the per-class statistics.
      conf_limbs: int32 ``[S, L]`` / ``[K, S, L]`` exact confidence sums
        (``exact_sums=True``), None otherwise.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax.metrics import BinnedStats
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> a = BinnedStats.from_batch(probs[:2], labels[:2], num_bins=5)
      >>> b = BinnedStats.from_batch(probs[2:], labels[2:], num_bins=5)
      >>> print(f"{float(a.merge(b).compute()):.3f}")
      0.150
    """

    count: jax.Array
    sum_conf: jax.Array
    sum_correct: jax.Array
    total: jax.Array
    conf_limbs: jax.Array | None = None
    num_bins: int = struct.field(pytree_node=False, default=15)
    convention: Convention = struct.field(
        pytree_node=False, default=_conventions.PRESETS[_conventions.DEFAULT]
    )
    classwise: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def empty(
        cls,
        num_bins: int = 15,
        *,
        convention: str | Convention = _conventions.DEFAULT,
        num_classes: int | None = None,
        exact_sums: bool = False,
    ) -> BinnedStats:
        """All-zero statistics (the identity of :meth:`merge`).

        Args:
          num_bins: static ``M``.
          convention: preset name or :class:`Convention`.
          num_classes: ``K`` for class-wise statistics, None for top-label.
          exact_sums: keep exact confidence sums (see the class docstring).
        """
        conv = _conventions.get_convention(convention)
        m = _checks.check_num_bins(num_bins)
        shape = (_conventions.num_slots(conv, m),)
        if num_classes is not None:
            shape = (int(num_classes),) + shape
        zeros = jnp.zeros(shape, jnp.int32)
        return cls(
            count=zeros,
            sum_conf=jnp.zeros(shape, jnp.float32),
            sum_correct=zeros,
            total=jnp.zeros((), jnp.int32),
            conf_limbs=_exact_sums.zeros(shape) if _exact(exact_sums) else None,
            num_bins=m,
            convention=conv,
            classwise=num_classes is not None,
        )

    @classmethod
    def from_batch(
        cls,
        probs: jax.typing.ArrayLike,
        labels: jax.typing.ArrayLike,
        *,
        num_bins: int = 15,
        convention: str | Convention = _conventions.DEFAULT,
        classwise: bool = False,
        where: jax.typing.ArrayLike | None = None,
        exact_sums: bool = False,
    ) -> BinnedStats:
        r"""Statistics of one batch of probabilities ``[N, K]`` and labels ``[N]``.

        Top-label: the confidence is :math:`\max_k p_{ik}` and the sample is
        correct when its label is the argmax (first maximal class on ties).
        Class-wise: every entry :math:`p_{ik}` is binned in the histogram of
        class ``k`` with outcome :math:`[y_i = k]`.

        Args:
          probs: float ``[N, K]`` rows on the probability simplex.
          labels: int ``[N]`` class ids in ``[0, K)``.
          num_bins: static int ``M >= 1``.
          convention: preset name or :class:`Convention`.
          classwise: static; per-class statistics ``[K, S]`` when True.
          where: optional bool ``[N]``; ``False`` rows are left out entirely.
          exact_sums: static; keep exact confidence sums (see the class
            docstring; about 3 scatter-adds per entry more).

        Returns:
          A :class:`BinnedStats`.
        """
        conv = _conventions.get_convention(convention)
        m = _checks.check_num_bins(num_bins)
        exact = _exact(exact_sums)
        probs, labels, where = _validate.check_probs_labels(probs, labels, where)
        return _from_batch(probs, labels, where, m, conv, bool(classwise), False, exact)

    @classmethod
    def from_confidences(
        cls,
        confidences: jax.typing.ArrayLike,
        correct: jax.typing.ArrayLike,
        *,
        num_bins: int = 15,
        convention: str | Convention = _conventions.DEFAULT,
        where: jax.typing.ArrayLike | None = None,
        exact_sums: bool = False,
    ) -> BinnedStats:
        """Top-label statistics from confidences ``[N]`` in [0, 1] and outcomes.

        Use it for binary problems scored by one probability, or for any
        precomputed confidence. ``correct`` is bool or 0/1 ``[N]``;
        ``exact_sums`` as in :meth:`from_batch`.
        """
        conv = _conventions.get_convention(convention)
        m = _checks.check_num_bins(num_bins)
        exact = _exact(exact_sums)
        conf, where = _validate.check_scores(confidences, where, name="confidences")
        correct = jnp.asarray(correct)
        if correct.shape != conf.shape:
            raise ValueError(
                f"correct must have shape {conf.shape}, got {correct.shape}."
            )
        if _checks.is_concrete(conf) and (
            float(jnp.min(conf)) < 0.0 or float(jnp.max(conf)) > 1.0
        ):
            raise ValueError("confidences must lie in [0, 1].")
        if _checks.is_concrete(correct) and not bool(
            jnp.all((correct == 0) | (correct == 1))
        ):
            raise ValueError("correct must be bool or 0/1 per row.")
        return _from_confidences(conf, correct.astype(bool), where, m, conv, exact)

    def merge(self, other: BinnedStats) -> BinnedStats:
        """Sum of two statistics with the same bins, convention and kind."""
        same = (self.num_bins, self.convention, self.classwise) == (
            other.num_bins,
            other.convention,
            other.classwise,
        )
        if not same or self.count.shape != other.count.shape:
            raise ValueError(
                "cannot merge BinnedStats with different num_bins, convention, "
                f"kind or shape: {self.num_bins}/{self.convention.name}/"
                f"{self.count.shape} vs {other.num_bins}/{other.convention.name}/"
                f"{other.count.shape}."
            )
        if (self.conf_limbs is None) != (other.conf_limbs is None):
            raise ValueError(
                "cannot merge BinnedStats with exact and with float32 confidence "
                "sums; expected the same exact_sums on both."
            )
        if self.conf_limbs is None:
            limbs, sum_conf = None, self.sum_conf + other.sum_conf
        else:
            limbs, sum_conf = _exact_sums.merge(self.conf_limbs, other.conf_limbs)
        return self.replace(
            count=self.count + other.count,
            sum_conf=sum_conf,
            sum_correct=self.sum_correct + other.sum_correct,
            total=self.total + other.total,
            conf_limbs=limbs,
        )

    __add__ = merge

    def compute(self, p: float = 1) -> jax.Array:
        r"""The calibration error of the accumulated samples.

        Top-label: ECE (``p=1``), RMSCE (``p=2``) or MCE (``p=inf``), see
        :func:`calib_jax.metrics.ece`. Class-wise: the class average of
        Def. A.1 of [1] (``p=1``) or its l2 version (``p=2``, root placed by
        ``convention.l2_root``), see :func:`calib_jax.metrics.classwise_ece`.

        References:
          [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration:
          AURC, Focal and Inverse Focal Loss", Def. A.1.
        """
        allowed = (1, 2) if self.classwise else (1, 2, float("inf"))
        p = _validate.check_p(p, allowed)
        return stats_error(self, p)

    def reliability(self) -> dict[str, jax.Array]:
        """Per-bin ``count``, mean ``confidence``, ``accuracy``, ``lower``, ``upper``.

        Empty bins report 0 confidence and accuracy; mask them with ``count``.
        """
        lower, upper = _conventions.slot_edges(self.convention, self.num_bins)
        safe = jnp.maximum(self.count, 1).astype(jnp.float32)
        return {
            "count": self.count,
            "confidence": self.sum_conf / safe,
            "accuracy": self.sum_correct.astype(jnp.float32) / safe,
            "lower": jnp.asarray(lower),
            "upper": jnp.asarray(upper),
        }


def stats_error(stats: BinnedStats, p: float) -> jax.Array:
    """The binned error of ``stats`` (:meth:`BinnedStats.compute`, traceable)."""
    conv = stats.convention
    if not stats.classwise:
        return _common.binned_error(
            stats.count,
            stats.sum_conf,
            stats.sum_correct,
            stats.total,
            p=p,
            min_count=conv.min_count,
        )
    return classwise_error(
        stats.count, stats.sum_conf, stats.sum_correct, stats.total, p, conv
    )


def classwise_error(count, sum_conf, sum_correct, total, p, convention):
    """Class mean of per-class binned errors ``[K, S] -> scalar``."""
    if p == 1 or convention.l2_root == "per_class":
        per_class = _common.binned_error(
            count, sum_conf, sum_correct, total, p=p, min_count=convention.min_count
        )
        return jnp.mean(per_class)
    count = count.astype(jnp.float32)
    gap = sum_conf.astype(jnp.float32) - sum_correct.astype(jnp.float32)
    keep = count >= convention.min_count
    denom = jnp.maximum(jnp.asarray(total, jnp.float32), 1.0)
    return jnp.sqrt(jnp.mean(_common.squared_error(count, gap, keep, denom)))


@kernels.dispatch("metric_classwise", _cpu_kernels.accumulate_classwise)
def accumulate_classwise(probs, labels, valid, *, num_bins, convention, screen=False):
    """Per-class per-bin ``(count, sum conf, sum correct)``, each ``[K, S]``
    (entry ``p_ik`` in class ``k``'s bins, correct when ``y_i = k``), as sums
    over ``bin >= s`` in one variadic reduction (one read of ``probs``), then
    differenced. With ``screen`` also the float ``[N]`` row sums of
    :func:`_common.screen_values` over every row."""
    above = _conventions.at_least(probs, num_bins, convention)
    above = above & valid[:, None, None]
    is_label = labels[:, None] == jnp.arange(probs.shape[1], dtype=labels.dtype)[None]
    # Excluded rows may hold NaN: select (not multiply) them away.
    terms = (
        above,
        jnp.where(above, probs[..., None], 0.0),
        above & is_label[..., None],
    )
    cum = _sum_rows(terms, (jnp.int32, probs.dtype, jnp.int32))
    out = tuple(c - jnp.pad(c[:, 1:], ((0, 0), (0, 1))) for c in cum)
    if screen:
        out = (*out, jnp.sum(_common.screen_values(probs), axis=1))
    return out


def _sum_rows(terms, dtypes):
    """Column sums of several ``[N, ...]`` arrays in one variadic reduction."""
    terms = tuple(t.astype(d) for t, d in zip(terms, dtypes))
    zeros = tuple(jnp.zeros((), d) for d in dtypes)
    add = lambda a, b: tuple(x + y for x, y in zip(a, b))  # noqa: E731
    return lax.reduce(terms, zeros, add, (0,))


def _exact(exact_sums) -> bool:
    return _checks.check_bool("exact_sums", exact_sums)


def _with_exact_sums(stats, conf, bins, valid):
    """``stats`` with exact confidence sums of the entries ``conf`` (``[N]``
    top-label, ``[N, K]`` class-wise) binned by ``bins``."""
    slots = _conventions.num_slots(stats.convention, stats.num_bins)
    keep = valid if conf.ndim == 1 else valid[:, None]
    limbs = _exact_sums.slot_sums(conf, _kernels.slot(bins, keep, slots), slots)
    return stats.replace(sum_conf=_exact_sums.to_float32(limbs), conf_limbs=limbs)


def stats_from_batch(
    probs, labels, where, num_bins, convention, classwise, screen=False, exact=False
):
    """:meth:`BinnedStats.from_batch` on checked inputs (traceable); with
    ``screen`` ``(stats, sums)``, the value screen's row sums too."""
    n = probs.shape[0]
    valid = _common.mask_or_ones(where, n)
    total = jnp.sum(valid.astype(jnp.int32))
    if classwise:
        probs = _common.as_float(probs)
        count, sum_conf, n_correct, *sums = accumulate_classwise(
            probs,
            labels.astype(jnp.int32),
            valid,
            num_bins=num_bins,
            convention=convention,
            screen=screen,
        )
    else:
        conf, correct, *sums = _common.top_label(probs, labels, screen=screen)
        bins = _conventions.bin_index(conf, num_bins, convention)
        slots = _conventions.num_slots(convention, num_bins)
        count, sum_conf, n_correct = _kernels.accumulate_top_label(
            conf, correct, bins, valid, slots
        )
    stats = BinnedStats(
        count=count,
        sum_conf=sum_conf,
        sum_correct=n_correct,
        total=total,
        num_bins=num_bins,
        convention=convention,
        classwise=classwise,
    )
    if exact:
        entries, bins = (
            (probs, _conventions.bin_index(probs, num_bins, convention))
            if classwise
            else (conf, bins)
        )
        stats = _with_exact_sums(stats, entries, bins, valid)
    return (stats, *sums) if screen else stats


def stats_from_confidences(conf, correct, where, num_bins, convention, exact=False):
    """Top-label :class:`BinnedStats` of ``(confidence, correct)`` rows
    (traceable; :meth:`BinnedStats.from_confidences` checks and jits it)."""
    conf = _common.as_float(conf)
    valid = _common.mask_or_ones(where, conf.shape[0])
    bins = _conventions.bin_index(conf, num_bins, convention)
    slots = _conventions.num_slots(convention, num_bins)
    count, sum_conf, n_correct = _kernels.accumulate_top_label(
        conf, correct, bins, valid, slots
    )
    stats = BinnedStats(
        count=count,
        sum_conf=sum_conf,
        sum_correct=n_correct,
        total=jnp.sum(valid.astype(jnp.int32)),
        num_bins=num_bins,
        convention=convention,
        classwise=False,
    )
    return _with_exact_sums(stats, conf, bins, valid) if exact else stats


_from_batch = jax.jit(stats_from_batch, static_argnums=(3, 4, 5, 6, 7))
_from_confidences = jax.jit(stats_from_confidences, static_argnums=(3, 4, 5))
