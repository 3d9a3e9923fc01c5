r"""Multi-label calibration: :func:`multilabel_ece`, and the per-label bin sums that
:class:`MultilabelStats` (``_multilabel_stats.py``) shares."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import _checks
from calib_jax.metrics import (
    _adaptive,
    _common,
    _conventions,
    _kernels,
)
from calib_jax.metrics._conventions import Convention

INPUTS = ("logits", "probs")
AVERAGES = ("macro", "micro", "none")
BINNINGS = ("equal_width", "equal_mass")


def value_summary(x, labels, where, inputs: str):
    """``(included, bad_rows, first_bad_row, bad_labels, row, label, value)``:
    bad rows hold NaN/inf (or, for probs, an entry outside [0, 1]); bad labels
    are targets not 0/1, the first at ``(row, label)`` (traceable)."""
    n, num_labels = x.shape
    valid = jnp.ones((n,), bool) if where is None else where
    xf = _common.as_float(x)
    ok = jnp.isfinite(xf)
    if inputs == "probs":
        ok = ok & (xf >= 0.0) & (xf <= 1.0)
    bad_row = valid & ~jnp.all(ok, axis=1)
    bad_label = valid[:, None] & (labels != 0) & (labels != 1)
    flat = jnp.argmax(bad_label.reshape(-1))
    included, bad_rows = _checks.count_true(valid, bad_row)
    bad_labels = jnp.sum(bad_label.astype(jnp.int32))
    return (
        included,
        bad_rows,
        jnp.argmax(bad_row),
        bad_labels,
        flat // num_labels,
        flat % num_labels,
        labels.reshape(-1)[flat],
    )


def raise_for_summary(summary, *, name: str, inputs: str) -> None:
    """Raises the one-line ValueError a :func:`value_summary` calls for."""
    if not _checks.is_concrete(*summary):
        return
    included, bad_rows, first_row, bad_labels, row, label, value = jax.device_get(
        summary
    )
    if int(included) == 0:
        raise ValueError(
            "where excludes every row: a metric needs at least one sample."
        )
    if int(bad_rows):
        if inputs == "probs":
            raise ValueError(
                f"{name} must be probabilities in [0, 1] with inputs='probs'; "
                f"{int(bad_rows)} row(s) hold a value outside it or NaN/inf "
                f"(first: row {int(first_row)}). For logits pass inputs='logits'."
            )
        raise ValueError(
            f"{name} contains NaN or inf in {int(bad_rows)} row(s) (first: row "
            f"{int(first_row)})."
        )
    if int(bad_labels):
        shown = value.item() if hasattr(value, "item") else value
        raise ValueError(
            f"labels must be 0 or 1 (one binary target per row and label); found "
            f"{shown!r} at row {int(row)}, label {int(label)} ({int(bad_labels)} "
            "target(s) not 0/1)."
        )


def check_options(num_bins, binning, average, inputs, convention):
    """Checks the options of :func:`multilabel_ece`; returns ``(M, convention)``."""
    conv = _conventions.get_convention(convention)
    m = _checks.check_num_bins(num_bins)
    _checks.check_choice("binning", binning, BINNINGS)
    _checks.check_choice("average", average, AVERAGES)
    _checks.check_choice("inputs", inputs, INPUTS)
    if binning == "equal_mass":
        _adaptive.check_equal_mass(conv)
    return m, conv


def label_probs(x: jax.Array, inputs: str) -> jax.Array:
    r"""Positive-class probabilities ``[N, L]``: :math:`\exp(\log\sigma(z))`
    for logits (stable at large :math:`|z|`), else the input."""
    x = _common.as_float(x)
    if inputs == "logits":
        return jnp.exp(jax.nn.log_sigmoid(x))
    return x


def prepared(x, labels, where, inputs):
    """``(probs, outcome, valid)``: excluded rows zeroed before the sigmoid,
    so NaN/inf padding reaches no sum."""
    valid = _common.mask_or_ones(where, x.shape[0])
    x = _common.as_float(x)
    if where is not None:
        x = jnp.where(valid[:, None], x, jnp.zeros_like(x))
    return label_probs(x, inputs), labels == 1, valid


def width_sums(probs, outcome, valid, num_bins, convention):
    """Per-label equal-width ``(count, sum_prob, sum_label)``, each ``[L, S]``:
    one scatter-add, the bin of entry ``(i, l)`` offset by ``l S``."""
    n, num_labels = probs.shape
    slots = _conventions.num_slots(convention, num_bins)
    bins = _conventions.bin_index(probs, num_bins, convention)
    offset = jnp.arange(num_labels, dtype=jnp.int32)[None, :] * slots
    seg = jnp.where(bins >= 0, bins + offset, -1)
    keep = jnp.broadcast_to(valid[:, None], (n, num_labels))
    count, sum_prob, sum_label = _kernels.accumulate_top_label(
        probs.reshape(-1),
        outcome.reshape(-1),
        seg.reshape(-1),
        keep.reshape(-1),
        num_labels * slots,
    )
    shape = (num_labels, slots)
    return count.reshape(shape), sum_prob.reshape(shape), sum_label.reshape(shape)


def mass_sums(conf, outcome, valid, num_bins, rule):
    """Equal-mass ``(count, sum_prob, sum_label, n)`` of one ``[N]`` vector, as
    :func:`calib_jax.metrics.adaptive_ece` bins it."""
    if rule == "rank" and conf.shape[0] >= _adaptive.SELECT_MIN_ROWS:
        return _adaptive.rank_stats(conf, outcome, valid, num_bins=num_bins)
    count, sum_conf, sum_label, n, _, _ = _adaptive.equal_mass_stats(
        conf, outcome, valid, num_bins, rule
    )
    return count, sum_conf, sum_label, n


def _per_label_error(count, sum_prob, sum_label, total, convention):
    """Binary binned ECE per label, ``[..., S] -> [...]``."""
    return _common.binned_error(
        count, sum_prob, sum_label, total, p=1, min_count=convention.min_count
    )


def reduce_sums(count, sum_prob, sum_label, total, average, convention):
    """ECE of per-label sums ``[L, S]`` (equal-width: the same bins for all
    labels, so the micro value pools the sums)."""
    if average == "micro":
        num_labels = count.shape[0]
        return _per_label_error(
            jnp.sum(count, axis=0),
            jnp.sum(sum_prob, axis=0),
            jnp.sum(sum_label, axis=0),
            total * num_labels,
            convention,
        )
    per_label = _per_label_error(count, sum_prob, sum_label, total, convention)
    return jnp.mean(per_label) if average == "macro" else per_label


def multilabel_core(x, labels, where, num_bins, binning, average, inputs, convention):
    """:func:`multilabel_ece` on checked inputs (traceable)."""
    probs, outcome, valid = prepared(x, labels, where, inputs)
    if binning == "equal_width":
        count, sum_prob, sum_label = width_sums(
            probs, outcome, valid, num_bins, convention
        )
        total = jnp.sum(valid.astype(jnp.int32))
        out = reduce_sums(count, sum_prob, sum_label, total, average, convention)
        return out.astype(jnp.float32)
    rule = convention.equal_mass
    if average == "micro":
        n, num_labels = probs.shape
        keep = jnp.broadcast_to(valid[:, None], (n, num_labels)).reshape(-1)
        count, sum_prob, sum_label, total = mass_sums(
            probs.reshape(-1), outcome.reshape(-1), keep, num_bins, rule
        )
        return _per_label_error(count, sum_prob, sum_label, total, convention).astype(
            jnp.float32
        )

    def one(conf, out):
        return mass_sums(conf, out, valid, num_bins, rule)

    count, sum_prob, sum_label, total = jax.vmap(one)(probs.T, outcome.T)
    per_label = _per_label_error(count, sum_prob, sum_label, total[0], convention)
    out = jnp.mean(per_label) if average == "macro" else per_label
    return out.astype(jnp.float32)


_STATIC = (3, 4, 5, 6, 7)
_core = jax.jit(multilabel_core, static_argnums=_STATIC)


@functools.partial(jax.jit, static_argnums=_STATIC)
def _checked_core(x, labels, where, num_bins, binning, average, inputs, convention):
    out = multilabel_core(
        x, labels, where, num_bins, binning, average, inputs, convention
    )
    return out, value_summary(x, labels, where, inputs)


def multilabel_ece(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    binning: str = "equal_width",
    average: str = "macro",
    inputs: str = "logits",
    convention: str | Convention = _conventions.DEFAULT,
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Multi-label ECE: binary binned ECE per label, macro/micro averaged.

    Each label :math:`l` is a binary problem scored by the sigmoid
    probability of its positive class, :math:`p_{il} = \sigma(z_{il})`
    (computed as :math:`\exp(\log\sigma(z))`, float32), and its ECE is the
    binned estimator of [1] (Def. 3.6; [2], Eq. (3)) applied to
    :math:`(p_{il}, y_{il})`:

    .. math::

        \mathrm{ECE}_l = \sum_{b} \frac{n_{lb}}{N}
        \big|\bar y_{lb} - \bar p_{lb}\big|, \qquad
        \mathrm{macro} = \frac{1}{L}\sum_{l} \mathrm{ECE}_l, \qquad
        \mathrm{micro} = \sum_b \frac{n_b}{N L}\big|\bar y_b - \bar p_b\big|,

    where the micro bins :math:`b` pool all :math:`N L` pairs: the per-label
    form of the class-wise ECE (Def. A.1 of [1]). Bins follow ``convention``
    as :func:`ece` (equal width) and :func:`adaptive_ece` (equal mass, per
    label; sort-based, so call once per split). :class:`MultilabelStats` is
    the mergeable equal-width form. Conventions: ``docs/metrics.md``,
    "Multi-label calibration".

    Args:
      logits: float ``[N, L]`` sigmoid logits (or probabilities of the
        positive class with ``inputs='probs'``).
      labels: ``[N, L]`` 0/1 targets (bool, integer or float).
      num_bins: static int ``M >= 1`` (per label).
      binning: ``'equal_width'`` or ``'equal_mass'``.
      average: ``'macro'`` (label mean), ``'micro'`` (pooled pairs) or
        ``'none'`` (the ``[L]`` per-label values).
      inputs: ``'logits'`` (default) or ``'probs'``.
      convention: preset name or :class:`~calib_jax.metrics.Convention`.
      where: optional bool ``[N]``; ``False`` rows are excluded entirely.

    Returns:
      float32 scalar (``[L]`` for ``average='none'``); global-batch value
      under a data-sharded ``jax.jit``.

    Raises:
      ValueError: unknown ``binning``/``average``/``inputs``, labels of
        another shape than ``logits``, and for concrete inputs labels not
        0/1, NaN/inf, probabilities outside [0, 1], or no included row.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. 3.6 and Def. A.1 (Eq. (18)).
      [2] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017, arXiv:1706.04599v2, Eq. (3).
      [3] J. Mukhoti et al., "Calibrating Deep Neural Networks using Focal
      Loss", NeurIPS 2020 (equal-mass bins, AdaECE).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.2], [0.3, 0.6], [0.8, 0.1], [0.2, 0.7]])
      >>> labels = jnp.array([[1, 0], [0, 1], [1, 1], [0, 0]])
      >>> ece = metrics.multilabel_ece(
      ...     probs, labels, num_bins=5, inputs="probs", average="none")
      >>> print([round(float(v), 3) for v in ece])
      [0.2, 0.35]
    """
    m, conv = check_options(num_bins, binning, average, inputs, convention)
    name = "logits" if inputs == "logits" else "probs"
    x, labels, where = _checks.check_multilabel(logits, labels, where, name=name)
    static = (m, binning, average, inputs, conv)
    if not _checks.is_concrete(x, labels, where):
        return _core(x, labels, where, *static)
    out, summary = _checked_core(x, labels, where, *static)
    raise_for_summary(_checks.fetch(out, summary), name=name, inputs=inputs)
    return out
