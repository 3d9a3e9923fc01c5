r"""Soft-binned expected calibration error, SB-ECE (Karandikar et al. 2021)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax.losses._base import (
    row_stats,
    safe_pow,
    zero_excluded_logits,
)
from calib_jax.losses._validation_base import (
    check_at_least_one,
    check_num_bins,
    check_positive,
    check_variant,
    prepare,
    reject,
)

KINDS = ("lb", "bin")
_SB_EPS = 1e-5  # secondary_losses.py: EPS mixed into the soft assignment


def soft_bin_membership(
    confidence: jax.Array, num_bins: int, temperature: jax.typing.ArrayLike
) -> jax.Array:
    r"""Soft membership :math:`u^*_{M,T}(c)` of confidences in M equal-width bins.

    .. math::

        u^*_{M,T}(c)_j = \operatorname{softmax}_j\!\Big(-\frac{(c - \xi_j)^2}{T}
        \Big), \qquad \xi_j = \frac{j - 1/2}{M},\ j = 1, \dots, M,

    Sec. 4.1 of [1]. As :math:`T \to 0` it tends to the one-hot indicator of
    the equal-width bin ``[(j-1)/M, j/M)`` holding :math:`c`.

    Args:
      confidence: float ``[B]`` values in [0, 1].
      num_bins: static int :math:`M`.
      temperature: soft-binning temperature :math:`T > 0`.

    Returns:
      ``[B, M]`` rows on the simplex.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, Sec. 4.1.
    """
    dtype = confidence.dtype
    centres = (jnp.arange(num_bins, dtype=dtype) + 0.5) / num_bins
    dist2 = (confidence[:, None] - centres[None, :]) ** 2
    return jax.nn.softmax(-dist2 / jnp.asarray(temperature, dtype), axis=-1)


def sb_ece(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    num_bins: int = 15,
    temperature: jax.typing.ArrayLike = 0.01,
    p: jax.typing.ArrayLike = 2.0,
    kind: str = "lb",
    variant: str = "paper",
    where: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""Soft-binned ECE of the top-label confidence (batch-level).

    The ECE estimators of Eqs. (6)–(7) of [1] with the hard bin membership
    replaced by the soft membership :func:`soft_bin_membership` (Sec. 4.1):

    .. math::

        S_j = \sum_i u_{ij},\quad
        C_j = \frac{1}{S_j}\sum_i u_{ij} c_i,\quad
        A_j = \frac{1}{S_j}\sum_i u_{ij} a_i \qquad \text{(Eqs. (8)–(10))}

        \text{kind='bin'}:\ \mathrm{SB\text{-}ECE}_{\mathrm{bin},p} =
        \Big(\sum_{j=1}^{M} \frac{S_j}{N} |A_j - C_j|^p\Big)^{1/p}
        \qquad \text{(Eq. (11))}

        \text{kind='lb'}:\ \mathrm{SB\text{-}ECE}_{\mathrm{lb},p} =
        \Big(\frac{1}{N}\sum_{i=1}^{N}\sum_{j=1}^{M} u_{ij}\,|A_j - c_i|^p
        \Big)^{1/p} \qquad \text{(Eq. (12))}

    with :math:`u_{ij} = u^*_{M,T}(c_i)_j`, confidence :math:`c_i = \max_k
    p_{ik}` and *hard* accuracy :math:`a_i = 1[\arg\max_k p_{ik} = y_i]` (no
    gradient; the first arg-max index must be the label, as in
    :func:`calib_jax.metrics.ece`). ``kind='lb'`` is the variant the paper
    trains with (App. G); ``lb >= bin`` for every ``p >= 1`` (Jensen). As
    :math:`T \to 0` both tend to the hard-binned ECE with the equal-width bins
    ``[(j-1)/M, j/M)``.

    Defaults: ``num_bins=15`` (App. G), ``p=2`` (the paper's tables); the paper
    publishes no :math:`T`: ``temperature=0.01`` is this library's (tune it).

    ``variant='released_code'`` (``kind='lb'``, ``p=2`` only) computes the
    authors' ``compute_squared_error_label_binning_tensorflow``
    (google/uncertainty-baselines, ``experimental/caltrain/secondary_losses.py``):

    .. math::

        \frac{1}{N}\sum_{i,j} \tilde u_{ij}\,(\tilde A_j - c_i)^2,\qquad
        \tilde u_{ij} = (1 - 10^{-5})\,u'_{ij} + \frac{10^{-5}}{M},\qquad
        \tilde A_j = \frac{\sum_i \tilde u_{ij} a_i}{\sum_i \tilde u_{ij}},

    with :math:`u'` the soft membership. Differences from the paper, one per line:

    * the bins span :math:`[1/K, 1]` (centres :math:`1/K + (j - 1/2)(1 - 1/K)/M`), not :math:`[0, 1]`;
    * :math:`10^{-5}/M` is mixed into every soft assignment (weight :math:`1 - 10^{-5}` on the softmax);
    * the value is the square, :math:`\mathrm{SB\text{-}ECE}_{\mathrm{lb},2}^2`, with no square root;
    * only the label-binned :math:`\ell_2` form exists (``kind='bin'`` or ``p != 2`` raise a ValueError);
    * no bin is dropped for small mass (the mixed-in :math:`10^{-5}/M` keeps every :math:`\sum_i \tilde u_{ij} > 0`).

    The normalised ``exp(-(b - c)^2 / T)`` is a softmax here (the released
    quotient underflows to 0/0 at small ``T``).

    Numerics: bins whose mass :math:`S_j` is below :math:`\sqrt{\text{tiny}}`
    (about :math:`10^{-19}` in float32) are treated as empty; the :math:`p`-th
    root and :math:`|\cdot|^p` use the subgradient 0 at 0 (a perfectly
    calibrated batch gives value 0 with zero gradient).

    Args:
      logits: float ``[B, K]`` unnormalised log-probabilities.
      labels: int ``[B]`` class ids in ``[0, K)``.
      num_bins: static int, number of bins :math:`M` (Sec. 4.1 of [1]).
      temperature: soft-binning temperature :math:`T > 0` (Sec. 4.1 of [1]).
      p: norm order :math:`p \ge 1` (Eqs. (11)–(12) of [1]).
      kind: static str, ``'lb'`` (Eq. (12)) or ``'bin'`` (Eq. (11)).
      variant: static str, ``'paper'`` (Eqs. (11)-(12)) or ``'released_code'``
        (the authors' TF code, ``kind='lb'`` and ``p=2`` only; see above).
      where: optional bool ``[B]``; ``False`` rows are ignored (padding).

    Returns:
      float32 scalar over the unmasked batch (global under data-sharded jit).

    Raises:
      ValueError: ``temperature <= 0``, ``p < 1``, ``num_bins < 1``, an
        unknown ``kind`` or ``variant``, or ``variant='released_code'`` with
        ``kind='bin'`` or ``p != 2``.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural Networks",
      NeurIPS 2021, Eqs. (8)–(12), App. G. Code:
      github.com/google/uncertainty-baselines,
      ``experimental/caltrain/secondary_losses.py``.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [3.0, 0.0]])
      >>> print(f"{float(sb_ece(logits, jnp.array([0, 0, 1, 0]))):.4f}")
      0.4433
    """
    num_bins = check_num_bins(num_bins)
    check_positive("temperature", temperature)
    check_at_least_one("p", p)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    variant = check_variant(variant)
    if variant == "released_code":
        if kind != "lb":
            reject("sb_ece", f"kind={kind!r} (only the label-binned 'lb')")
        if isinstance(p, jax.core.Tracer):
            reject("sb_ece", "a traced p (only the squared l2 form: pass p=2)")
        if float(p) != 2.0:
            reject("sb_ece", f"p={p!r} (only the squared l2 form, p=2)")
    logits, labels, mask = prepare(logits, labels, where)
    if variant == "released_code":
        return _sb_ece_released(logits, labels, mask, temperature, num_bins=num_bins)
    return _sb_ece(logits, labels, mask, temperature, p, num_bins=num_bins, kind=kind)


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _sb_ece_released(logits, labels, mask, temperature, *, num_bins):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, conf=True)
    conf, acc = rows.conf, rows.correct  # acc: hard correctness, no gradient
    dtype = conf.dtype
    edges = jnp.linspace(1.0 / logits.shape[1], 1.0, num_bins + 1, dtype=dtype)
    centres = 0.5 * edges[1:] + 0.5 * edges[:-1]
    # A softmax: exp(-(b - p)^2 / T) normalised without underflow at small T.
    c_pre = jax.nn.softmax(
        -((centres[None, :] - conf[:, None]) ** 2) / jnp.asarray(temperature, dtype),
        axis=1,
    )
    c = (1.0 - _SB_EPS) * c_pre + _SB_EPS / num_bins
    c = jnp.where(mask[:, None], c, 0.0)
    a_bar = jnp.sum(c * acc[:, None], axis=0) / jnp.sum(c, axis=0)
    sq = jnp.sum(c * (a_bar[None, :] - conf[:, None]) ** 2)
    n = jnp.maximum(jnp.sum(mask.astype(dtype)), 1.0)
    return sq / n


@functools.partial(jax.jit, static_argnames=("num_bins", "kind"))
def _sb_ece(logits, labels, mask, temperature, p, *, num_bins, kind):
    logits = zero_excluded_logits(logits, mask)
    rows = row_stats(logits, labels, conf=True)
    return sb_ece_from_confidences(
        rows.conf, rows.correct, mask, temperature, p, num_bins=num_bins, kind=kind
    )


def sb_ece_from_confidences(
    conf: jax.Array,
    correct: jax.Array,
    mask: jax.Array,
    temperature: jax.typing.ArrayLike,
    p: jax.typing.ArrayLike,
    *,
    num_bins: int,
    kind: str,
) -> jax.Array:
    r"""SB-ECE of :func:`sb_ece` from per-row confidences (batch-level).

    Everything :func:`sb_ece` computes after the softmax (Eqs. (8)-(12) of
    [1]), for confidences computed another way (e.g. of :math:`z/T` in
    ``posthoc.fit_temperature``). Derivatives flow through ``conf`` only; only
    ``kind`` is checked, the values are the caller's to validate.

    Args:
      conf: float ``[B]`` top-label confidences :math:`c_i`.
      correct: float ``[B]`` hard accuracies :math:`a_i` in {0, 1}.
      mask: bool ``[B]``; ``False`` rows are ignored.
      temperature: soft-binning temperature :math:`T > 0`.
      p: norm order :math:`p \ge 1`.
      num_bins: static int :math:`M`.
      kind: static str, ``'lb'`` (Eq. (12)) or ``'bin'`` (Eq. (11)).

    Returns:
      Scalar of ``conf``'s dtype.

    References:
      [1] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, Eqs. (8)-(12).

    Examples:
      >>> import jax.numpy as jnp
      >>> conf = jnp.array([0.9, 0.8, 0.6, 0.95])
      >>> correct = jnp.array([1.0, 0.0, 1.0, 1.0])
      >>> mask = jnp.ones(4, bool)
      >>> v = sb_ece_from_confidences(conf, correct, mask, 0.01, 2, num_bins=5, kind="lb")
      >>> print(f"{float(v):.4f}")
      0.2014
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    dtype = conf.dtype
    acc = correct.astype(dtype)
    p = jnp.asarray(p, dtype)
    u = soft_bin_membership(conf, num_bins, temperature)
    u = jnp.where(mask[:, None], u, 0.0)
    n = jnp.maximum(jnp.sum(mask.astype(dtype)), 1.0)
    size = jnp.sum(u, axis=0)  # S_j, Eq. (8)
    # Bins of negligible mass are dropped: dividing by a subnormal S_j would
    # overflow in the backward pass (their share of the value is < 1e-19).
    occupied = size > jnp.sqrt(jnp.finfo(dtype).tiny)
    safe_size = jnp.where(occupied, size, 1.0)
    if kind == "bin":
        # A_j - C_j = sum_i u_ij (a_i - c_i) / S_j  (Eqs. (9)-(10)).
        gap = jnp.sum(u * (acc - conf)[:, None], axis=0) / safe_size
        total = jnp.sum(jnp.where(occupied, size * safe_pow(jnp.abs(gap), p), 0.0))
    else:
        # A_j, Eq. (10), as 1 - sum_i u_ij (1 - a_i) / S_j: a bin of accurate
        # samples gets A_j == 1 exactly, whatever order XLA sums S_j in.
        bin_acc = 1.0 - jnp.sum(u * (1.0 - acc)[:, None], axis=0) / safe_size
        dev = safe_pow(jnp.abs(bin_acc[None, :] - conf[:, None]), p)
        total = jnp.sum(jnp.where(occupied[None, :], u * dev, 0.0))
    return safe_pow(total / n, 1.0 / p)
