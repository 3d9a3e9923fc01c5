r"""The :class:`ConformalPredictor` pytree and the split-conformal fitters.

A predictor holds the calibrated threshold :math:`\hat q` and the score's
options; ``predict_sets(logits, key=None)`` gives boolean ``[N, K]`` sets.
Fitting and prediction are jitted and vmap over calibration splits (the
threshold is a leaf; the method's options are static).

With logits whose class axis is split over devices (``jax.Array`` placed
e.g. by :func:`calib_jax.sharding.shard_classes`), ``predict_sets`` and
``scores`` of APS and RAPS, and the fit on such calibration logits, take
the row-sum form of :mod:`calib_jax.conformal._by_reduction` (no sort, so
no gather of ``[N, K]``); other inputs keep the sorted form, bit for bit as
before.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from calib_jax import sharding
from calib_jax.conformal import _by_reduction, _scores


def probs_of(logits: jax.Array) -> jax.Array:
    """Softmax of ``logits`` in float32 (or wider)."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return jax.nn.softmax(logits, axis=-1)


def uniforms(key, n: int, dtype):
    return None if key is None else jax.random.uniform(key, (n,), dtype)


@functools.partial(jax.jit, static_argnames=("method", "k_reg", "class_sharded"))
def scores_core(method, logits, labels, u, lam, *, k_reg, class_sharded=False):
    """The labels' conformity scores; ``class_sharded`` (static): APS/RAPS
    by row sums (``_by_reduction.raps_score``) instead of the row sort."""
    probs = probs_of(logits)
    if method == "thr":
        return _scores.thr_score(probs, labels)
    if class_sharded:
        return _by_reduction.raps_score(probs, labels, u, lam, k_reg=k_reg)
    return _scores.raps_score_core(probs, labels, u, lam, k_reg=k_reg)


@functools.partial(
    jax.jit, static_argnames=("method", "k_reg", "allow_empty", "class_sharded")
)
def _sets_core(method, logits, qhat, u, lam, *, k_reg, allow_empty, class_sharded):
    probs = probs_of(logits)
    if method == "thr":
        sets = _scores.thr_sets(probs, qhat)
    elif class_sharded:
        # The sets of the row-sum scores: a bisection over each row's ranking
        # key with row reductions only (label in set exactly when its
        # row-sum score is at most qhat).
        sets = _by_reduction.raps_sets(probs, qhat, u, lam, k_reg=k_reg)
    else:
        sets = _scores.raps_sets_core(probs, qhat, u, lam, k_reg=k_reg)
    return sets if allow_empty else with_top_class(sets, probs)


def with_top_class(sets, probs):
    """``sets`` with the top class (first arg-max) added to every empty set:
    never less coverage (``allow_empty=False``)."""
    top = jax.nn.one_hot(jnp.argmax(probs, axis=-1), probs.shape[-1], dtype=bool)
    empty = ~jnp.any(sets, axis=-1, keepdims=True)
    return sets | (top & empty)


@jax.jit
def _nonfinite_rows(logits):
    """The number of rows with NaN/inf and the first such row (two scalars:
    a row reduction that stays on each device's classes)."""
    bad = ~jnp.all(jnp.isfinite(logits), axis=1)
    return jnp.sum(bad.astype(jnp.int32)), jnp.argmax(bad)


def check_class_sharded(class_sharded) -> None:
    if class_sharded is not None and not isinstance(class_sharded, bool):
        raise ValueError(
            f"class_sharded must be None (decided by the logits' placement), "
            f"True or False, got {class_sharded!r}."
        )


@struct.dataclass
class ConformalPredictor:
    r"""A fitted split-conformal predictor: threshold plus score options.

    A pytree: ``qhat`` and ``lam`` are leaves (a vmapped fit gives batched
    thresholds), everything else is static.

    Attributes:
      qhat: float32 scalar, the :math:`\lceil (n+1)(1-\alpha) \rceil`-th
        smallest calibration score.
      lam: float32 scalar RAPS penalty :math:`\lambda` (0 for THR and APS).
      method: ``'thr'``, ``'aps'`` or ``'raps'``.
      k_reg: RAPS :math:`k_{reg}` (0 for THR and APS).
      randomized: True when the scores use one uniform :math:`u` per row;
        ``predict_sets`` then needs a PRNG key.
      allow_empty: False adds the top class to empty sets (conservative).
      alpha: the miscoverage level it was fitted for.
      num_classes: :math:`K`.
      num_calibration: :math:`n`, the number of calibration rows.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from calib_jax import conformal
      >>> z = 2.0 * jax.random.normal(jax.random.key(0), (500, 5))
      >>> y = jax.random.categorical(jax.random.key(1), z)
      >>> pred = conformal.fit("aps", z, y, alpha=0.1)
      >>> pred.predict_sets(z[:3]).shape
      (3, 5)
    """

    qhat: jax.Array
    lam: jax.Array
    method: str = struct.field(pytree_node=False, default="thr")
    k_reg: int = struct.field(pytree_node=False, default=0)
    randomized: bool = struct.field(pytree_node=False, default=False)
    allow_empty: bool = struct.field(pytree_node=False, default=True)
    alpha: float = struct.field(pytree_node=False, default=0.1)
    num_classes: int = struct.field(pytree_node=False, default=0)
    num_calibration: int = struct.field(pytree_node=False, default=0)

    def _check(self, logits, key):
        logits = jnp.asarray(logits)
        if not jnp.issubdtype(logits.dtype, jnp.floating):
            raise TypeError(f"logits must be floating point, got dtype {logits.dtype}.")
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits must have shape [N, {self.num_classes}] (the predictor "
                f"was fitted on K = {self.num_classes}), got shape {logits.shape}."
            )
        if self.randomized and key is None:
            raise ValueError(
                f"this {self.method!r} predictor is randomised (fitted with a key): "
                "predict_sets needs a PRNG key, e.g. key=jax.random.key(0)."
            )
        if isinstance(logits, jax.core.Tracer):
            return logits
        if len(logits.sharding.device_set) > 1:
            # Spread over devices (maybe processes): reduce there, fetch two
            # scalars, never the array.
            count, first = (int(v) for v in _nonfinite_rows(logits))
        else:
            bad = ~np.isfinite(np.asarray(logits)).all(axis=1)
            count, first = int(bad.sum()), int(np.argmax(bad))
        if count:
            raise ValueError(
                f"logits contains NaN or inf in {count} row(s) (first: row {first})."
            )
        return logits

    def _row_sums(self, logits, class_sharded) -> bool:
        """Whether APS/RAPS take the row-sum form: ``class_sharded``, or,
        when it is None, whether ``logits``' class axis is split over
        devices (:func:`calib_jax.sharding.is_class_sharded`)."""
        check_class_sharded(class_sharded)
        if self.method == "thr":
            return False  # elementwise on the softmax: no sort to avoid
        if class_sharded is None:
            return sharding.is_class_sharded(logits)
        return class_sharded

    def predict_sets(
        self,
        logits: jax.typing.ArrayLike,
        key: jax.Array | None = None,
        *,
        class_sharded: bool | None = None,
    ) -> jax.Array:
        """Prediction sets of the rows of ``logits``.

        APS and RAPS sets come from one sort per row, or, with the class
        axis split over devices, from row sums: a per-row bisection over the
        ranking key (``conformal.raps_sets(..., class_sharded=True)``), which
        moves ``O(N)`` values between devices per step instead of gathering
        ``[N, K]``. The two forms agree to float32 rounding (sets differ only
        where a cumulative mass reaches 1.0, see docs/conformal.md); THR's
        sets are elementwise and the same either way.

        Args:
          logits: float ``[N, K]`` logits (the same kind the predictor was
            fitted on, e.g. after the same calibrator); softmax is applied
            in float32.
          key: PRNG key of the per-row uniforms; required when
            ``randomized``, ignored otherwise.
          class_sharded: ``None`` (default): the row-sum form exactly when
            ``logits`` is a ``jax.Array`` whose class axis is split over
            more than one device (:func:`calib_jax.sharding.is_class_sharded`;
            under an outer ``jax.jit`` the placement is not visible, so the
            sorted form); True or False forces one form.

        Returns:
          bool ``[N, K]``; ``True`` marks the classes in each row's set.

        Raises:
          ValueError: wrong shape, NaN/inf logits (eager calls) or a missing
            key for a randomised predictor.
        """
        logits = self._check(logits, key)
        row_sums = self._row_sums(logits, class_sharded)
        u = uniforms(key, logits.shape[0], jnp.float32) if self.randomized else None
        return _sets_core(
            self.method,
            logits,
            self.qhat,
            u,
            self.lam,
            k_reg=self.k_reg,
            allow_empty=self.allow_empty,
            class_sharded=row_sums,
        )

    def scores(
        self,
        logits: jax.typing.ArrayLike,
        labels: jax.typing.ArrayLike,
        key: jax.Array | None = None,
        *,
        class_sharded: bool | None = None,
    ) -> jax.Array:
        """Conformity scores ``[N]`` of ``labels`` (the values ``qhat`` thresholds).

        ``labels[i] in predict_sets(logits, key)[i]`` exactly when
        ``scores(logits, labels, key)[i] <= qhat`` (with ``allow_empty``),
        the two calls taking the same form (``class_sharded``, see
        :meth:`predict_sets`).
        """
        logits = self._check(logits, key)
        labels = _scores.check_labels(labels, *logits.shape)
        row_sums = self._row_sums(logits, class_sharded)
        u = uniforms(key, logits.shape[0], jnp.float32) if self.randomized else None
        return scores_core(
            self.method,
            logits,
            labels,
            u,
            self.lam,
            k_reg=self.k_reg,
            class_sharded=row_sums,
        )


def fit_predictor(
    method: str,
    logits: jax.Array,
    labels: jax.Array,
    *,
    alpha: float,
    key: jax.Array | None = None,
    lam: float = 0.0,
    k_reg: int = 0,
    allow_empty: bool = True,
) -> ConformalPredictor:
    """Calibrates ``method`` on checked inputs (see :func:`calib_jax.conformal.fit`)."""
    _scores.quantile_rank(logits.shape[0], alpha)  # before scoring: n large enough
    scores, fitted = calibration_scores(
        method,
        logits,
        labels,
        alpha=alpha,
        key=key,
        lam=lam,
        k_reg=k_reg,
        allow_empty=allow_empty,
    )
    return predictor_of_scores(method, scores, **fitted)


def calibration_scores(
    method, logits, labels, *, alpha, key, lam, k_reg, allow_empty
) -> tuple[jax.Array, dict]:
    """``(scores, fitted)``: the labels' conformity scores of the calibration
    rows (one uniform per row when randomised; the row-sum form on
    class-sharded logits), and the options of the predictor of those scores
    (the keyword arguments of :func:`predictor_fields`). The marginal and
    the Mondrian fits share it."""
    randomized = key is not None and method != "thr"
    u = uniforms(key, logits.shape[0], jnp.float32) if randomized else None
    lam = jnp.asarray(lam, jnp.float32)
    # Class-sharded calibration logits: the row-sum scores (no row sort).
    row_sums = method != "thr" and sharding.is_class_sharded(logits)
    scores = scores_core(
        method, logits, labels, u, lam, k_reg=k_reg, class_sharded=row_sums
    )
    fitted = {
        "num_classes": logits.shape[1],
        "alpha": alpha,
        "randomized": randomized,
        "lam": lam,
        "k_reg": k_reg,
        "allow_empty": allow_empty,
    }
    return scores, fitted


def predictor_fields(
    method: str,
    n: int,
    *,
    num_classes: int,
    alpha: float,
    randomized: bool,
    lam: jax.Array,
    k_reg: int,
    allow_empty: bool,
) -> dict:
    """The fields of a predictor fitted on ``n`` calibration scores, all but
    ``qhat`` (the marginal and the Mondrian predictor's alike)."""
    return {
        "lam": lam,
        "method": method,
        "k_reg": k_reg,
        "randomized": randomized,
        "allow_empty": bool(allow_empty),
        "alpha": float(alpha),
        "num_classes": int(num_classes),
        "num_calibration": int(n),
    }


def predictor_of_scores(method: str, scores: jax.Array, **fitted) -> ConformalPredictor:
    """The predictor whose ``qhat`` is the conformal quantile of the ``n``
    calibration ``scores`` (those of :func:`scores_core`, in any row order);
    ``fitted``: the keyword arguments of :func:`predictor_fields`."""
    n = scores.shape[0]
    return ConformalPredictor(
        qhat=_scores.order_statistic(
            scores, rank=_scores.quantile_rank(n, fitted["alpha"])
        ),
        **predictor_fields(method, n, **fitted),
    )
