r"""Proper scoring rules and accuracy: Brier score, NLL, top-1 accuracy (means of
per-row values over the included rows)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from calib_jax.metrics import _common, _inputs, _logit_rows, _validate


def _masked_mean(values, where):
    valid = _common.mask_or_ones(where, values.shape[0])
    total = jnp.sum(jnp.where(valid, values, 0.0))
    return total / jnp.maximum(jnp.sum(valid.astype(values.dtype)), 1.0)


@jax.jit
def _brier_core(probs, labels, where):
    probs = _common.as_float(probs)
    p_label = _common.label_prob(probs, labels)
    per_row = jnp.sum(probs * probs, axis=1) - 2.0 * p_label + 1.0
    return _masked_mean(per_row, where)


@jax.jit
def _nll_core(probs, labels, where):
    p_label = _common.label_prob(probs, labels)
    tiny = jnp.finfo(p_label.dtype).tiny
    return _masked_mean(-jnp.log(jnp.maximum(p_label, tiny)), where)


@jax.jit
def _brier_logits_core(logits, labels, where):
    return _masked_mean(_logit_rows.brier_rows(logits, labels), where)


@jax.jit
def _nll_logits_core(logits, labels, where):
    return _masked_mean(-_logit_rows.label_log_prob(logits, labels), where)


def _accuracy_rows(conf, correct, where):
    return _masked_mean(correct.astype(jnp.float32), where)


_accuracy_core = jax.jit(_inputs.on_probs(_accuracy_rows))
_accuracy_rows_core = jax.jit(_accuracy_rows)


def brier(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Multi-class Brier score: mean squared distance to the one-hot label.

    .. math::

        \mathrm{BS} = \frac{1}{N}\sum_i \sum_{k} (p_{ik} - [y_i = k])^2
        = \frac{1}{N}\sum_i \Big(\sum_k p_{ik}^2 - 2 p_{iy_i} + 1\Big),

    Def. A.2 (Eq. (19)) of [1]; summed over classes (range [0, 2]), not
    divided by ``K``.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex, or ``[N, K]``
        logits with ``from_logits`` (not top-label rows: this metric needs
        every class).
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar.

    References:
      [1] H. Zhou et al., "Revisiting Reweighted Risk for Calibration: AURC,
      Focal and Inverse Focal Loss", Def. A.2.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.brier(probs, labels)):.3f}")
      0.350
    """
    logits = _inputs.logits_input(
        probs, labels, where, from_logits=from_logits, metric="brier"
    )
    if logits is not None:
        return _inputs.evaluate(_brier_logits_core, _inputs.LOGITS, *logits)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(_brier_core, probs, labels, where)


def nll(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Negative log-likelihood of the labels, mean over samples.

    .. math::

        \mathrm{NLL} = -\frac{1}{N}\sum_i \log \max(p_{iy_i}, t),

    with :math:`t` the smallest normal number of the dtype (1.18e-38 for
    float32), so a zero label probability gives a large finite value
    (about 87.3) instead of inf.

    From logits (``from_logits=True``) each row is
    :math:`\mathrm{LSE}(z_i) - z_{iy_i}`: the value of the softmax's
    probabilities to float32 rounding, except that a label logit more than
    about 87 below the row's maximum stays exact instead of clamping.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex, or ``[N, K]``
        logits with ``from_logits`` (not top-label rows: this metric needs
        every class).
      labels: int ``[N]`` class ids in ``[0, K)``.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar.

    References:
      [1] C. Guo et al., "On Calibration of Modern Neural Networks", ICML
      2017 (negative log likelihood as a calibration measure).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.nll(probs, labels)):.3f}")
      0.511
    """
    logits = _inputs.logits_input(
        probs, labels, where, from_logits=from_logits, metric="nll"
    )
    if logits is not None:
        return _inputs.evaluate(_nll_logits_core, _inputs.LOGITS, *logits)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(_nll_core, probs, labels, where)


def accuracy(
    probs: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    where: jax.typing.ArrayLike | None = None,
    from_logits: bool = False,
) -> jax.Array:
    r"""Top-1 accuracy: fraction of samples whose label is the argmax class.

    .. math::

        \mathrm{acc} = \frac{1}{N}\sum_i [\,\operatorname{argmax}_k p_{ik}
        = y_i\,],

    with ties going to the first maximal class (``np.argmax``), the rule of
    every top-label metric here.

    Args:
      probs: float ``[N, K]`` rows on the probability simplex; ``[N, K]``
        logits with ``from_logits``; or :class:`~calib_jax.metrics.TopLabelRows`
        ``(confidence, correct)`` with ``labels=None``.
      labels: int ``[N]`` class ids in ``[0, K)``; None with top-label rows.
      where: optional bool ``[N]``; ``False`` rows are excluded.
      from_logits: static bool; ``probs`` holds logits (bf16, fp16 or
        float32; ``docs/metrics.md``, "Logits and top-label rows in").

    Returns:
      float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> probs = jnp.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
      >>> labels = jnp.array([0, 0, 0, 1])
      >>> print(f"{float(metrics.accuracy(probs, labels)):.3f}")
      0.750
    """
    rows = _inputs.top_label_input(
        probs, labels, where, from_logits=from_logits, metric="accuracy"
    )
    if rows is not None:
        (conf, correct), where = rows
        return _accuracy_rows_core(conf, correct, where)
    probs, labels, where = _validate.check_probs_labels(
        probs, labels, where, values=False
    )
    return _validate.evaluate(_accuracy_core, probs, labels, where)
