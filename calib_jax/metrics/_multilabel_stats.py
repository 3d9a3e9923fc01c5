r"""Mergeable equal-width statistics of :func:`calib_jax.metrics.multilabel_ece`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from calib_jax import _checks
from calib_jax.metrics import _conventions, _multilabel
from calib_jax.metrics._conventions import Convention


@struct.dataclass
class MultilabelStats:
    r"""Per-label equal-width bin sums of :func:`multilabel_ece` (mergeable).

    They add across batches and devices (:meth:`merge` or ``+``) and
    :meth:`compute` reduces them once: a split evaluated in chunks gives the
    value of the whole split (probability sums up to summation order).

    Attributes:
      count: int32 ``[L, S]`` entries per label and bin.
      sum_prob: float ``[L, S]`` sum of probabilities.
      sum_label: int32 ``[L, S]`` positive targets.
      total: int32 scalar, included rows ``N``.
      num_bins: static ``M``; ``S = M`` (``M + 1`` with ``top='extra'``).
      convention: static :class:`~calib_jax.metrics.Convention`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax.metrics import MultilabelStats
      >>> z = jnp.array([[2.0, -1.0], [-0.5, 0.4], [1.5, -2.0], [-1.0, 1.0]])
      >>> y = jnp.array([[1, 0], [0, 1], [1, 1], [0, 0]])
      >>> a = MultilabelStats.from_batch(z[:2], y[:2], num_bins=5)
      >>> b = MultilabelStats.from_batch(z[2:], y[2:], num_bins=5)
      >>> print(f"{float(a.merge(b).compute()):.4f}")
      0.4038
    """

    count: jax.Array
    sum_prob: jax.Array
    sum_label: jax.Array
    total: jax.Array
    num_bins: int = struct.field(pytree_node=False, default=15)
    convention: Convention = struct.field(
        pytree_node=False, default=_conventions.PRESETS[_conventions.DEFAULT]
    )

    @classmethod
    def empty(
        cls,
        num_labels: int,
        num_bins: int = 15,
        *,
        convention: str | Convention = _conventions.DEFAULT,
    ) -> MultilabelStats:
        """All-zero statistics for ``num_labels`` labels (:meth:`merge`'s identity)."""
        conv = _conventions.get_convention(convention)
        m = _checks.check_num_bins(num_bins)
        num_labels = _checks.check_positive_int("num_labels", num_labels)
        shape = (num_labels, _conventions.num_slots(conv, m))
        zeros = jnp.zeros(shape, jnp.int32)
        return cls(
            count=zeros,
            sum_prob=jnp.zeros(shape, jnp.float32),
            sum_label=zeros,
            total=jnp.zeros((), jnp.int32),
            num_bins=m,
            convention=conv,
        )

    @classmethod
    def from_batch(
        cls,
        logits: jax.typing.ArrayLike,
        labels: jax.typing.ArrayLike,
        *,
        num_bins: int = 15,
        inputs: str = "logits",
        convention: str | Convention = _conventions.DEFAULT,
        where: jax.typing.ArrayLike | None = None,
    ) -> MultilabelStats:
        """Statistics of one batch (arguments as :func:`multilabel_ece`)."""
        m, conv = _multilabel.check_options(
            num_bins, "equal_width", "macro", inputs, convention
        )
        name = "logits" if inputs == "logits" else "probs"
        x, labels, where = _checks.check_multilabel(logits, labels, where, name=name)
        if _checks.is_concrete(x, labels, where):
            summary = _summary_jit(x, labels, where, inputs)
            _multilabel.raise_for_summary(summary, name=name, inputs=inputs)
        return _stats_from_batch(x, labels, where, m, inputs, conv)

    def merge(self, other: MultilabelStats) -> MultilabelStats:
        """Sum of two statistics with the same labels, bins and convention."""
        same = (self.num_bins, self.convention) == (other.num_bins, other.convention)
        if not same or self.count.shape != other.count.shape:
            raise ValueError(
                "cannot merge MultilabelStats with different num_bins, convention "
                f"or number of labels: {self.num_bins}/{self.convention.name}/"
                f"{self.count.shape} vs {other.num_bins}/{other.convention.name}/"
                f"{other.count.shape}."
            )
        return self.replace(
            count=self.count + other.count,
            sum_prob=self.sum_prob + other.sum_prob,
            sum_label=self.sum_label + other.sum_label,
            total=self.total + other.total,
        )

    __add__ = merge

    def compute(self, average: str = "macro") -> jax.Array:
        """:func:`multilabel_ece` of the accumulated rows for ``average``."""
        _checks.check_choice("average", average, _multilabel.AVERAGES)
        return _compute(
            self.count,
            self.sum_prob,
            self.sum_label,
            self.total,
            average,
            self.convention,
        )


def stats_from_batch(x, labels, where, num_bins, inputs, convention):
    """:meth:`MultilabelStats.from_batch` on checked inputs (traceable)."""
    probs, outcome, valid = _multilabel.prepared(x, labels, where, inputs)
    count, sum_prob, sum_label = _multilabel.width_sums(
        probs, outcome, valid, num_bins, convention
    )
    return MultilabelStats(
        count=count,
        sum_prob=sum_prob,
        sum_label=sum_label,
        total=jnp.sum(valid.astype(jnp.int32)),
        num_bins=num_bins,
        convention=convention,
    )


@functools.partial(jax.jit, static_argnums=(4, 5))
def _compute(count, sum_prob, sum_label, total, average, convention):
    out = _multilabel.reduce_sums(
        count, sum_prob, sum_label, total, average, convention
    )
    return out.astype(jnp.float32)


_stats_from_batch = jax.jit(stats_from_batch, static_argnums=(3, 4, 5))
_summary_jit = jax.jit(_multilabel.value_summary, static_argnums=3)
