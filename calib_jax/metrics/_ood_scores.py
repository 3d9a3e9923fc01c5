r"""Per-row OOD scores from logits, higher = more in-distribution, computed from the
log-softmax (``docs/metrics.md``, "OOD scores")."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks

OOD_SCORES = ("msp", "max_logit", "energy", "entropy", "mutual_information")

_K_HINT = " for an OOD score"


def _check_logits(logits, name: str = "logits") -> jax.Array:
    """Static checks of float ``[N, K]`` logits (``N = 0`` is allowed)."""
    x = _checks.check_floating(logits, name)
    _checks.check_rank(x, name, "[N, K]")
    if x.shape[1] < 2:
        raise ValueError(
            f"{name} has K = {x.shape[1]} class(es) (shape {x.shape}); at least 2 "
            f"classes (K >= 2) are needed{_K_HINT}."
        )
    return x


def _check_members(member_logits) -> jax.Array:
    """Static checks of float ``[M, N, K]`` member logits (``M >= 1``)."""
    x = _checks.check_floating(member_logits, "member_logits")
    _checks.check_rank(x, "member_logits", "[M, N, K]")
    if x.shape[0] == 0:
        raise ValueError(
            f"member_logits has M = 0 members (shape {x.shape}); at least one "
            "ensemble member or MC-dropout sample is needed."
        )
    if x.shape[2] < 2:
        raise ValueError(
            f"member_logits has K = {x.shape[2]} class(es) (shape {x.shape}); at "
            f"least 2 classes (K >= 2) are needed{_K_HINT}."
        )
    return x


@functools.partial(jax.jit, static_argnums=0)
def _with_summary(core, x, *args):
    """``core(x, *args)`` and the NaN/inf screen of ``x`` in one program."""
    finite = jnp.all(jnp.isfinite(x), axis=-1).reshape(-1)
    (bad,) = _checks.count_true(~finite)
    first = jnp.argmax(~finite) if finite.size else jnp.zeros((), jnp.int32)
    return core(x, *args), bad, first


def _evaluate(core, x, *args, name: str = "logits"):
    """``core(x, *args)``; concrete inputs screened for NaN/inf in the same call."""
    if not _checks.is_concrete(x, *args):
        return core(x, *args)
    out, bad, first = _with_summary(core, x, *args)
    # The [N] scores stay on the device.
    bad, first = (int(v) for v in jax.device_get((bad, first)))
    if bad:
        if x.ndim == 3:
            member, row = np.unravel_index(first, x.shape[:2])
            where = f"member {int(member)}, row {int(row)}"
        else:
            where = f"row {first}"
        raise ValueError(
            f"{name} contains NaN or inf in {bad} row(s) (first: {where})."
        )
    return out


def _upcast(x: jax.Array) -> jax.Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _entropy(log_p: jax.Array) -> jax.Array:
    """``-sum_k p_k log p_k`` over the last axis, with ``0 log 0 = 0``."""
    p = jnp.exp(log_p)
    return -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), axis=-1)


@jax.jit
def _msp_core(x):
    x = _upcast(x)
    shifted = x - jnp.max(x, axis=-1, keepdims=True)
    # max_k softmax(x)_k = exp(0) / sum_k exp(x_k - max x).
    return (1.0 / jnp.sum(jnp.exp(shifted), axis=-1)).astype(jnp.float32)


@jax.jit
def _max_logit_core(x):
    return jnp.max(_upcast(x), axis=-1).astype(jnp.float32)


@jax.jit
def _energy_core(x, temperature):
    x = _upcast(x)
    t = jnp.asarray(temperature, x.dtype)
    m = jnp.max(x, axis=-1)
    # T logsumexp(x / T) = m + T log sum_k exp((x_k - m) / T): no overflow of
    # x / T for small T, and the limit m as T -> 0 is reached exactly.
    rest = jnp.log(jnp.sum(jnp.exp((x - m[:, None]) / t), axis=-1))
    return (m + t * rest).astype(jnp.float32)


@jax.jit
def _entropy_core(x):
    return (-_entropy(jax.nn.log_softmax(_upcast(x), axis=-1))).astype(jnp.float32)


@jax.jit
def _mutual_information_core(members):
    log_p = jax.nn.log_softmax(_upcast(members), axis=-1)  # [M, N, K]
    num_members = members.shape[0]
    # log of the mean member probability, log (1/M) sum_m p_m, in log space.
    log_mean = jax.nn.logsumexp(log_p, axis=0) - jnp.log(float(num_members))
    total = _entropy(log_mean)  # H(mean_m p_m), [N]
    expected = jnp.mean(_entropy(log_p), axis=0)  # mean_m H(p_m), [N]
    # Jensen: total >= expected; the clamp removes rounding below 0 (members
    # that agree to the last bit give 0 up to a few ulps of log K).
    return jnp.maximum(total - expected, 0.0).astype(jnp.float32)


@jax.jit
def _mutual_information_score_core(members):
    return -_mutual_information_core(members)


def max_softmax_score(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Maximum softmax probability (MSP) of each row; per-example.

    The baseline OOD score of [1]: the confidence of the predicted class,
    computed as ``1 / sum_k exp(z_k - max z)`` (exact at any magnitude).

    .. math::

        s(z) = \max_k \frac{e^{z_k}}{\sum_j e^{z_j}}

    Args:
      logits: float ``[N, K]`` logits (any float dtype; bf16/fp16 upcast).

    Returns:
      float32 ``[N]`` in ``[1/K, 1]``; higher = more in-distribution.

    References:
      [1] D. Hendrycks, K. Gimpel, "A Baseline for Detecting Misclassified and
      Out-of-Distribution Examples in Neural Networks", ICLR 2017,
      arXiv:1610.02136, Sec. 2 (the maximum softmax probability).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> z = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
      >>> print(", ".join(f"{v:.4f}" for v in metrics.max_softmax_score(z)))
      0.7870, 0.3333
    """
    return _evaluate(_msp_core, _check_logits(logits))


def max_logit_score(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Maximum logit (MaxLogit) of each row; per-example.

    The MaxLogit detector of [1]: the largest unnormalised logit, which keeps
    the scale information that the softmax divides out.

    .. math::

        s(z) = \max_k z_k

    Args:
      logits: float ``[N, K]`` logits (any float dtype; bf16/fp16 upcast).

    Returns:
      float32 ``[N]``; higher = more in-distribution.

    References:
      [1] D. Hendrycks, S. Basart, M. Mazeika, A. Zou, J. Kwon, M. Mostajabi,
      J. Steinhardt, D. Song, "Scaling Out-of-Distribution Detection for
      Real-World Settings", ICML 2022 (PMLR 162), arXiv:1911.11132 (the
      MaxLogit baseline: the anomaly score is minus the maximum logit).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> z = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
      >>> print(metrics.max_logit_score(z))
      [2. 1.]
    """
    return _evaluate(_max_logit_core, _check_logits(logits))


def energy_score(
    logits: jax.typing.ArrayLike, *, temperature: jax.typing.ArrayLike = 1.0
) -> jax.Array:
    r"""Negative free energy of each row; per-example.

    The energy score of [1], minus the free energy :math:`E` of the logits
    (lower energy = more in-distribution). It lies in ``[max z, max z + T log
    K]`` and tends to :func:`max_logit_score` as ``T -> 0``.

    .. math::

        s(z) = -E(z) = T \log \sum_k e^{z_k / T}

    Args:
      logits: float ``[N, K]`` logits (any float dtype; bf16/fp16 upcast).
      temperature: ``T > 0`` (traceable scalar; [1] uses ``T = 1``).

    Returns:
      float32 ``[N]``; higher = more in-distribution.

    Raises:
      ValueError: a concrete ``temperature`` that is not ``> 0``.

    References:
      [1] W. Liu, X. Wang, J. D. Owens, Y. Li, "Energy-based
      Out-of-distribution Detection", NeurIPS 2020, arXiv:2010.03759, Sec. 2-3.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> z = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
      >>> print(", ".join(f"{v:.4f}" for v in metrics.energy_score(z)))
      2.2395, 2.0986
    """
    _checks.check_positive("temperature", temperature)
    return _evaluate(_energy_core, _check_logits(logits), temperature)


def entropy_score(logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Minus the predictive entropy of ``softmax(logits)``; per-example.

    The entropy of the predicted distribution is the total predictive
    uncertainty ([1], the left-hand side of the decomposition of
    :func:`mutual_information`); its negative ranks confident rows first
    (``0 log 0 = 0``).

    .. math::

        s(z) = -H[p] = \sum_k p_k \log p_k, \qquad p = \mathrm{softmax}(z)

    Args:
      logits: float ``[N, K]`` logits (any float dtype; bf16/fp16 upcast).
        For an ensemble or MC dropout pass the log of the mean member
        probabilities to score the total uncertainty.

    Returns:
      float32 ``[N]`` in ``[-log K, 0]``; higher = more in-distribution.

    References:
      [1] S. Depeweg, J. M. Hernández-Lobato, F. Doshi-Velez, S. Udluft,
      "Decomposition of Uncertainty in Bayesian Deep Learning for Efficient
      and Risk-sensitive Learning", ICML 2018, arXiv:1710.07283 (total
      uncertainty as the entropy of the predictive distribution).

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> z = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
      >>> print(", ".join(f"{v:.4f}" for v in metrics.entropy_score(z)))
      -0.6656, -1.0986
    """
    return _evaluate(_entropy_core, _check_logits(logits))


def mutual_information(member_logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Mutual information between the prediction and the model; per-example.

    For ``M`` ensemble members or MC-dropout samples with probabilities
    :math:`p_m = \mathrm{softmax}(z_m)`, the total predictive entropy splits
    into the expected entropy of the members (aleatoric) and the mutual
    information (epistemic; the BALD quantity of [1], estimated from samples
    as in [2], decomposed as in [3]):

    .. math::

        \mathrm{MI} = H\Big[\frac1M\sum_m p_m\Big] - \frac1M\sum_m H[p_m].

    ``0 <= MI <= min(log K, log M)`` (rounding below 0 is clamped), 0 when
    all members agree. Higher MI means *less* in-distribution; use
    :func:`mutual_information_score` for the "higher = in" convention.

    Args:
      member_logits: float ``[M, N, K]`` logits of ``M`` members (or samples)
        for ``N`` rows (any float dtype; bf16/fp16 upcast).

    Returns:
      float32 ``[N]`` in ``[0, log K]``.

    References:
      [1] N. Houlsby, F. Huszár, Z. Ghahramani, M. Lengyel, "Bayesian Active
      Learning for Classification and Preference Learning", arXiv:1112.5745
      (2011), Sec. 2 (BALD: the entropy of the predictive distribution minus
      the expected entropy under the posterior).
      [2] Y. Gal, "Uncertainty in Deep Learning", PhD thesis, University of
      Cambridge, 2016, Sec. 3.3.1 (the MC-dropout estimate of the mutual
      information).
      [3] S. Depeweg, J. M. Hernández-Lobato, F. Doshi-Velez, S. Udluft,
      "Decomposition of Uncertainty in Bayesian Deep Learning for Efficient
      and Risk-sensitive Learning", ICML 2018, arXiv:1710.07283.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> agree = jnp.array([[[3.0, 0.0]], [[3.0, 0.0]]])
      >>> disagree = jnp.array([[[3.0, 0.0]], [[0.0, 3.0]]])
      >>> print(f"{float(metrics.mutual_information(agree)[0]):.4f}")
      0.0000
      >>> print(f"{float(metrics.mutual_information(disagree)[0]):.4f}")
      0.5023
    """
    x = _check_members(member_logits)
    return _evaluate(_mutual_information_core, x, name="member_logits")


def mutual_information_score(member_logits: jax.typing.ArrayLike) -> jax.Array:
    r"""Minus :func:`mutual_information` (same argument and references), in
    :math:`[-\log K, 0]`; per-example, higher = more in-distribution.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> members = jnp.array([[[3.0, 0.0]], [[0.0, 3.0]]])
      >>> print(f"{float(metrics.mutual_information_score(members)[0]):.4f}")
      -0.5023
    """
    x = _check_members(member_logits)
    return _evaluate(_mutual_information_score_core, x, name="member_logits")


_BY_NAME = {
    "msp": max_softmax_score,
    "max_logit": max_logit_score,
    "energy": energy_score,
    "entropy": entropy_score,
}


def ood_score(
    name: str,
    logits: jax.typing.ArrayLike,
    *,
    member_logits: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    r"""The OOD score ``name`` of each row (one of :data:`OOD_SCORES`).

    ``'msp'``, ``'max_logit'``, ``'energy'`` (``T = 1``), ``'entropy'`` and
    ``'mutual_information'`` (:func:`mutual_information_score`, minus the MI):
    every score is "higher = more in-distribution".

    Args:
      name: one of ``OOD_SCORES``.
      logits: float ``[N, K]`` logits of the prediction (possibly calibrated;
        for an ensemble or MC dropout, the log of the mean member
        probabilities).
      member_logits: float ``[M, N, K]`` logits of the ensemble members or
        MC-dropout samples, with the ``[N, K]`` of ``logits``; required by
        (and the only input of) ``'mutual_information'``.

    Returns:
      float32 ``[N]``; higher = more in-distribution.

    Raises:
      ValueError: an unknown ``name``, ``'mutual_information'`` without
        ``member_logits``, member logits of another ``[N, K]`` than
        ``logits``, and the errors of the score itself.

    References:
      As the score functions above.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import metrics
      >>> z = jnp.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
      >>> print(metrics.ood_score("max_logit", z))
      [2. 1.]
    """
    if not isinstance(name, str) or name not in OOD_SCORES:
        raise ValueError(
            f"Unknown OOD score {name!r}; known scores (OOD_SCORES): "
            f"{', '.join(OOD_SCORES)}."
        )
    x = _check_logits(logits)
    members = None
    if member_logits is not None:
        members = _check_members(member_logits)
        if members.shape[1:] != x.shape:
            raise ValueError(
                f"member_logits must have shape [M, N, K] with [N, K] = {x.shape} "
                f"(the shape of logits), got shape {members.shape}."
            )
    if name == "mutual_information":
        if members is None:
            raise ValueError(
                "ood_score('mutual_information') needs member_logits: float "
                "[M, N, K] logits of the ensemble members or MC-dropout samples."
            )
        return mutual_information_score(members)
    return _BY_NAME[name](x)
