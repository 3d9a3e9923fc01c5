"""``PREDICTORS`` registry, ``get_predictor`` and ``fit``.

Names: ``'thr'`` (THR/LAC), ``'aps'`` and ``'raps'``; each also fits the
class-conditional (Mondrian) version, one threshold per class, with
``mondrian=True``. Each fitter takes
calibration logits ``[n, K]``, labels ``[n]``, the level ``alpha`` and an
optional PRNG ``key`` (``None``: non-randomised scores) and returns a
:class:`ConformalPredictor`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax

from calib_jax import _checks
from calib_jax.conformal import _mondrian, _predictor, _scores
from calib_jax.conformal._predictor import ConformalPredictor


def _checked(logits, labels, alpha):
    logits, labels, where = _checks.check_scores_labels(
        logits, labels, None, name="logits", purpose="fitting"
    )
    _checks.check_values(logits, labels, where, name="logits", family="fit")
    _scores.quantile_rank(logits.shape[0], alpha)  # alpha in (0, 1), n large enough
    return logits, labels


def check_lam(lam) -> None:
    if not isinstance(lam, jax.core.Tracer):
        try:
            value = float(lam)
        except (TypeError, ValueError):
            raise ValueError(f"lam must be a number >= 0, got {lam!r}.") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"lam must be finite and >= 0, got {lam!r}.")


def _dispatch(method, logits, labels, *, mondrian, absent, **kwargs):
    """The marginal or the Mondrian fit of ``method`` on checked inputs."""
    mondrian = _checks.check_bool("mondrian", mondrian)
    absent = check_absent(mondrian, absent)
    if not mondrian:
        return _predictor.fit_predictor(method, logits, labels, **kwargs)
    return _mondrian.fit_mondrian(method, logits, labels, absent=absent, **kwargs)


def check_absent(mondrian: bool, absent):
    """``absent`` checked: None (marginal), or one of ``ABSENT`` (None: 'error')."""
    if not mondrian:
        if absent is not None:
            raise ValueError(
                f"absent={absent!r} applies to Mondrian predictors only "
                "(mondrian=True); leave it None for a marginal predictor."
            )
        return None
    absent = "error" if absent is None else absent
    return _checks.check_choice("absent", absent, _mondrian.ABSENT)


def fit_thr(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    key: jax.Array | None = None,
    allow_empty: bool = True,
    mondrian: bool = False,
    absent: str | None = None,
) -> ConformalPredictor:
    """Split-conformal THR/LAC (Sadinle et al. 2019); see :func:`fit`.

    THR has no randomised variant: ``key`` is accepted and ignored, so that
    one loop can fit every method.
    """
    logits, labels = _checked(logits, labels, alpha)
    del key
    return _dispatch(
        "thr",
        logits,
        labels,
        alpha=alpha,
        allow_empty=allow_empty,
        mondrian=mondrian,
        absent=absent,
    )


def fit_aps(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    key: jax.Array | None = None,
    allow_empty: bool = True,
    mondrian: bool = False,
    absent: str | None = None,
) -> ConformalPredictor:
    """Split-conformal APS (Romano et al. 2020); see :func:`fit`."""
    logits, labels = _checked(logits, labels, alpha)
    return _dispatch(
        "aps",
        logits,
        labels,
        alpha=alpha,
        key=key,
        allow_empty=allow_empty,
        mondrian=mondrian,
        absent=absent,
    )


def fit_raps(
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    key: jax.Array | None = None,
    lam: float = 0.1,
    k_reg: int = 1,
    allow_empty: bool = True,
    mondrian: bool = False,
    absent: str | None = None,
) -> ConformalPredictor:
    """Split-conformal RAPS (Angelopoulos et al. 2021); see :func:`fit`.

    ``lam`` (:math:`\\lambda \\ge 0`) and ``k_reg`` (int :math:`\\ge 0`)
    default to 0.1 and 1, torch-uncertainty's defaults.
    """
    logits, labels = _checked(logits, labels, alpha)
    k_reg = _scores.check_k_reg(k_reg)
    check_lam(lam)
    return _dispatch(
        "raps",
        logits,
        labels,
        alpha=alpha,
        key=key,
        lam=lam,
        k_reg=k_reg,
        allow_empty=allow_empty,
        mondrian=mondrian,
        absent=absent,
    )


PREDICTORS: dict[str, Callable[..., ConformalPredictor]] = {
    "thr": fit_thr,
    "aps": fit_aps,
    "raps": fit_raps,
}


def get_predictor(name: str) -> Callable[..., ConformalPredictor]:
    """Returns the fitter ``(logits, labels, *, alpha, key=None, **kw)``.

    Raises:
      ValueError: unknown name; the message lists the known names.
    """
    if not isinstance(name, str) or name not in PREDICTORS:
        raise ValueError(
            f"unknown conformal method {name!r}; known methods: "
            f"{', '.join(PREDICTORS)}."
        )
    return PREDICTORS[name]


def fit(
    name: str,
    logits: jax.typing.ArrayLike,
    labels: jax.typing.ArrayLike,
    *,
    alpha: float,
    key: jax.Array | None = None,
    **kwargs,
) -> ConformalPredictor:
    r"""Calibrates the split-conformal method ``name`` on held-out logits.

    Scores every calibration row with the method's conformity score (on
    ``softmax(logits)`` in float32) and keeps :math:`\hat q`, the
    :math:`\lceil (n+1)(1-\alpha) \rceil`-th smallest. For exchangeable
    calibration and test rows, ``predict_sets`` then covers the test label
    with probability in :math:`[1-\alpha, 1-\alpha+1/(n+1)]` (the upper
    bound when scores have no ties and ``allow_empty`` is True).

    Pure and jittable (``alpha`` and the options are static; the value
    checks run on concrete inputs only), and it vmaps over splits and keys.

    Args:
      name: ``'thr'``, ``'aps'`` or ``'raps'`` (see :data:`PREDICTORS`).
      logits: float ``[n, K]`` calibration logits, e.g. a calibrator's
        output on held-out data; the same transformation must be applied to
        the logits given to ``predict_sets``.
      labels: int ``[n]`` class ids in ``[0, K)``.
      alpha: miscoverage level in (0, 1); needs :math:`n \ge 1/\alpha - 1`.
      key: PRNG key for randomised APS/RAPS scores (one uniform per row);
        ``None`` gives the non-randomised scores (:math:`u = 1`). Use a
        different key for ``predict_sets``.
      **kwargs: ``allow_empty`` (default True; False adds the top class to
        empty sets, which can only raise coverage), for RAPS ``lam``
        (default 0.1) and ``k_reg`` (default 1); ``mondrian`` (default
        False; True: class-conditional coverage, one threshold per class,
        see :class:`MondrianPredictor`) and, with it, ``absent``: what a
        class with fewer than :math:`1/\alpha - 1` calibration rows gets,
        ``'error'`` (the default), ``'marginal'`` or ``'full'``.

    Returns:
      A :class:`ConformalPredictor` (a :class:`MondrianPredictor`, with
      ``qhat`` of shape ``[K]``, with ``mondrian=True``).

    Raises:
      ValueError: unknown name or option, ``alpha`` outside (0, 1), a
        calibration set too small for ``alpha`` (:math:`n < 1/\alpha - 1`),
        NaN/inf logits, labels out of range, ``K < 2`` or mismatched
        lengths, and with ``mondrian=True`` and ``absent='error'`` a class
        with too few calibration rows (naming the class and ``alpha``); all
        one-line messages.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> z = 3.0 * jax.random.normal(jax.random.key(0), (2000, 10))
      >>> y = jax.random.categorical(jax.random.key(1), z)
      >>> pred = conformal.fit("raps", z[:1000], y[:1000], alpha=0.1)
      >>> sets = pred.predict_sets(z[1000:])
      >>> print(f"{float(conformal.coverage(sets, y[1000:])):.3f}")
      0.890
    """
    fitter = get_predictor(name)
    try:
        return fitter(logits, labels, alpha=alpha, key=key, **kwargs)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise ValueError(
                f"unknown option for conformal method {name!r}: {err}."
            ) from None
        raise
