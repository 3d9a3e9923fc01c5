r"""Class-conditional (Mondrian) split-conformal prediction sets.

A Mondrian predictor calibrates one threshold per class: :math:`\hat q_y` is
the :math:`\lceil (n_y + 1)(1 - \alpha) \rceil`-th smallest conformity score
among the :math:`n_y` calibration rows of class :math:`y`, and the set of
``x`` is :math:`C(x) = \{y : s(x, y) \le \hat q_y\}`. Within each class the
calibration rows and a test row of that class are exchangeable, so the
split-conformal argument holds class by class:

.. math::

    1 - \alpha \;\le\; P(y \in C(x) \mid y) \;\le\;
    1 - \alpha + \frac{1}{n_y + 1}

(the upper bound for tie-free scores, conditionally on the class counts),
where the marginal predictor only guarantees the average over classes.
The conformity scores are THR's, APS's or RAPS's (see
:mod:`calib_jax.conformal._scores`); APS/RAPS sets are then no longer the
top-:math:`L` classes of a row, since each class has its own threshold.

A class needs :math:`n_y \ge 1/\alpha - 1` calibration rows (else the rank
exceeds :math:`n_y`). ``absent`` decides what happens to a class with fewer
(including a class absent from the calibration set): ``'error'`` (default)
raises at fit on concrete labels; ``'marginal'`` gives it the pooled
(non-Mondrian) threshold of all :math:`n` rows (marginal coverage only);
``'full'`` gives it :math:`\hat q_y = +\infty`, so it is in every set
(coverage 1 for that class, the convention :math:`\hat q = \infty` when the
rank exceeds the sample of Lei et al. 2018). Under ``jax.jit``/``vmap`` the
labels are traced and cannot be checked: ``'error'`` then behaves as
``'full'``. Each threshold is an order statistic of its class, not a sum
over rows, so (as the marginal :math:`\hat q`) it has no mergeable form:
the calibration scores are needed in one call.

With the class axis sharded over devices, THR's sets (``1 - p <= q_y``,
elementwise on the softmax) work per shard. APS's and RAPS's need each
class's rank and the mass ranked before it among all ``K`` classes of the
row: with one threshold per class the set is not a prefix of the ranking,
so no reduction of ``O(N)`` partials gives it (the marginal predictor's
bisection needs one threshold per row). On logits whose class axis is split
over devices (a ``jax.Array`` with a ``NamedSharding``) the sets and scores
therefore reshard the rows: one all-to-all over the class axes gives each
device whole rows, ``ceil(N / D)`` of them for the ``D`` devices holding the
rows and classes (each device's rows padded to a multiple of the class
devices, the padding cut after), i.e. its own share of ``[N, K]`` and never
the whole array (the row sort's temporaries are of that size too); the
sorted form runs on them row by row, and a second all-to-all puts the bool
sets back on the input's sharding. The values are the one-device values exactly (the
per-row uniforms travel with their rows). The fit needs only the labels'
scores: on class-sharded calibration logits it takes their row-sum form.

References:
  [1] V. Vovk, A. Gammerman and G. Shafer, "Algorithmic Learning in a Random
  World", Springer 2005 (Mondrian conformal predictors); V. Vovk,
  D. Lindsay, I. Nouretdinov and A. Gammerman, "Mondrian Confidence
  Machine", technical report, 2003.
  [2] M. Sadinle, J. Lei and L. Wasserman, "Least Ambiguous Set-Valued
  Classifiers with Bounded Error Levels", JASA 114(525), 2019,
  arXiv:1609.00451v2 (the classifier with class-specific coverage: one
  threshold per class, estimated on the held-out rows of that class).
  [3] J. Lei, M. G'Sell, A. Rinaldo, R. J. Tibshirani and L. Wasserman,
  "Distribution-Free Predictive Inference for Regression", JASA 2018,
  arXiv:1604.04173v2, Thm. 2.2.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import _checks, sharding
from calib_jax.conformal import _predictor, _scores
from calib_jax.conformal._predictor import ConformalPredictor, check_class_sharded

ABSENT = ("error", "marginal", "full")


def rank_table(n: int, alpha: float) -> np.ndarray:
    r"""int32 ``[n + 1]``: entry ``m`` is :math:`\lceil (m + 1)(1 - \alpha)
    \rceil`, the quantile rank for a class with ``m`` calibration rows.

    Exact rational arithmetic on the shortest decimal of ``alpha``, as
    :func:`calib_jax.conformal.quantile_rank`. An entry above ``m`` means the
    class has too few rows for ``alpha``.
    """
    exact = Fraction(repr(_scores.check_alpha(alpha)))
    a, b = exact.numerator, exact.denominator
    if (n + 2) * b < 2**62:
        m1 = np.arange(1, n + 2, dtype=np.int64)
        return (-((-m1 * (b - a)) // b)).astype(np.int32)
    return np.asarray(
        [-((-(m + 1) * (b - a)) // b) for m in range(n + 1)], dtype=np.int32
    )


def min_class_rows(alpha: float) -> int:
    r"""The fewest rows a class needs at level ``alpha``: :math:`\lceil 1/\alpha
    - 1 \rceil`."""
    exact = Fraction(repr(_scores.check_alpha(alpha)))
    return math.ceil(1 / exact - 1)


def check_class_counts(labels, num_classes: int, alpha: float) -> None:
    """One-line ValueError naming the first class with too few rows for ``alpha``."""
    counts = np.bincount(np.asarray(labels).astype(np.int64), minlength=num_classes)
    need = min_class_rows(alpha)
    short = np.flatnonzero(counts[:num_classes] < need)
    if short.size == 0:
        return
    first = int(short[0])
    more = f" (and {short.size - 1} more class(es))" if short.size > 1 else ""
    what = "is absent from" if counts[first] == 0 else f"has {counts[first]} row(s) in"
    raise ValueError(
        f"class {first} {what} the calibration set{more}: a Mondrian predictor "
        f"at alpha={alpha} needs at least {need} rows per class (n_y >= 1/alpha "
        "- 1); pass absent='marginal' or absent='full' (the valid choices: "
        f"{', '.join(ABSENT)}), more calibration rows or a larger alpha."
    )


@functools.partial(jax.jit, static_argnames=("num_classes", "absent", "marginal_rank"))
def class_quantiles(scores, labels, table, *, num_classes, absent, marginal_rank):
    r"""Per-class split-conformal thresholds ``[K]`` and class counts ``[K]``.

    One lexicographic sort of (label, score) puts each class's scores in a
    contiguous ascending run; :math:`\hat q_y` is the entry of rank
    ``table[n_y]`` of the run of class :math:`y`. Classes whose rank exceeds
    their count get the ``absent`` fallback.
    """
    n = scores.shape[0]
    labels = labels.astype(jnp.int32)
    counts = jax.ops.segment_sum(
        jnp.ones((n,), jnp.int32), labels, num_segments=num_classes
    )
    _, ordered = lax.sort((labels, scores), num_keys=2)
    starts = jnp.cumsum(counts) - counts
    ranks = jnp.asarray(table, jnp.int32)[counts]
    enough = ranks <= counts
    q = ordered[jnp.clip(starts + ranks - 1, 0, n - 1)]
    if absent == "marginal":
        fallback = jnp.sort(scores)[marginal_rank - 1]
    else:
        fallback = jnp.asarray(jnp.inf, scores.dtype)
    return jnp.where(enough, q, fallback), counts


def class_scores(probs, u, lam, *, method: str, k_reg: int):
    """The conformity score of every class of every row, ``[N, K]`` in class order.

    Equal, entry by entry, to the label scores of the marginal predictor's
    fit (the same ranked-score array read at each class's rank, ties broken
    by the lower class index first); tested bit for bit.
    """
    if method == "thr":
        return 1.0 - probs
    # The scores along each row's ranking, as the marginal APS/RAPS's.
    _, ranked = _scores.sorted_scores(probs, u, lam, k_reg)
    # Stable argsort of -p: equal probabilities keep index order, the
    # ranking rule of _label_positions.
    order = jnp.argsort(-probs, axis=-1, stable=True)
    position = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(ranked, position, axis=1)


def _sets_of(method, logits, qhat, u, lam, *, k_reg, allow_empty):
    """The sets of whole rows: each class's score against its threshold."""
    probs = _predictor.probs_of(logits)
    scores = class_scores(probs, u, lam, method=method, k_reg=k_reg)
    sets = scores <= qhat.astype(scores.dtype)[None, :]
    return sets if allow_empty else _predictor.with_top_class(sets, probs)


def rows_layout(logits) -> tuple[Mesh, P] | None:
    """``(mesh, spec)`` of ``logits`` when its class axis is split over more
    than one device of a ``NamedSharding`` (``spec`` padded to two entries),
    else None (one device, whole rows on every device, a tracer)."""
    if not sharding.is_class_sharded(logits):
        return None
    placed = logits.sharding
    if not isinstance(placed, NamedSharding):
        return None
    spec = tuple(placed.spec) + (None,) * (2 - len(placed.spec))
    return placed.mesh, P(*spec)


def _axes(entry) -> tuple:
    """The mesh axes of one ``PartitionSpec`` entry, as a tuple."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def by_rows(fn, layout, logits, *rows, whole_rows: bool):
    """``fn(logits, *rows)`` of class-sharded ``logits``, run on whole rows.

    ``layout`` is :func:`rows_layout`'s ``(mesh, spec)``: each device holds
    a block of ``N / R`` rows by ``K / C`` classes (``R``, ``C``: the
    devices of the row and class axes of ``spec``). The block's rows are
    padded to ``C * m``, ``m = ceil(N / (R * C))`` (zero logits, cut after),
    and one all-to-all over the class axes gives each device ``m`` whole
    rows; ``rows`` (``[N]`` arrays or None, e.g. the uniforms) are cut the
    same way, so they travel with their rows. ``fn`` runs on them; its
    ``[m, K]`` result (``whole_rows``) goes back to ``spec`` by a second
    all-to-all, an ``[m]`` result by an all-gather of ``C * m`` values over
    the class axes (the rows split as ``spec[0]``). Traced inside the
    caller's ``jax.jit``.
    """
    mesh, spec = layout
    row_axes, class_axes = _axes(spec[0]), _axes(spec[1])
    c = math.prod(mesh.shape[a] for a in class_axes)
    block_rows = logits.shape[0] // math.prod(mesh.shape[a] for a in row_axes)
    m = -(-block_rows // c)
    pad = c * m - block_rows
    present = [r for r in rows if r is not None]

    def local(block, *parts):
        block = jnp.pad(block, ((0, pad), (0, 0)))
        block = lax.all_to_all(block, class_axes, 0, 1, tiled=True)
        # This device's m rows of its row block, in the class axes' order.
        start = lax.axis_index(class_axes) * m
        parts = iter(parts)
        mine = [
            None
            if r is None
            else lax.dynamic_slice_in_dim(jnp.pad(next(parts), (0, pad)), start, m)
            for r in rows
        ]
        out = fn(block, *mine)
        if whole_rows:
            return lax.all_to_all(out, class_axes, 1, 0, tiled=True)[:block_rows]
        return lax.all_gather(out, class_axes, tiled=True)[:block_rows]

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec,) + (P(spec[0]),) * len(present),
        out_specs=spec if whole_rows else P(spec[0]),
        check_vma=False,
    )(logits, *present)


@functools.partial(
    jax.jit, static_argnames=("method", "k_reg", "allow_empty", "layout")
)
def _sets_core(method, logits, qhat, u, lam, *, k_reg, allow_empty, layout=None):
    """The sets; ``layout`` (static, :func:`rows_layout`): on whole rows
    after an all-to-all (:func:`by_rows`), else one program."""
    sets_of = functools.partial(
        _sets_of, method, qhat=qhat, lam=lam, k_reg=k_reg, allow_empty=allow_empty
    )
    if layout is None:
        return sets_of(logits, u=u)
    return by_rows(lambda z, u: sets_of(z, u=u), layout, logits, u, whole_rows=True)


@functools.partial(jax.jit, static_argnames=("method", "k_reg", "layout"))
def _scores_core(method, logits, labels, u, lam, *, k_reg, layout=None):
    """The labels' scores by the sorted form (the values the sets compare),
    on whole rows after an all-to-all when ``layout`` is given."""
    score_of = functools.partial(_predictor.scores_core, method, lam=lam, k_reg=k_reg)
    if layout is None:
        return score_of(logits, labels, u)
    return by_rows(score_of, layout, logits, labels, u, whole_rows=False)


@struct.dataclass
class MondrianPredictor(ConformalPredictor):
    r"""A fitted class-conditional (Mondrian) split-conformal predictor.

    A :class:`ConformalPredictor` whose ``qhat`` is float32 ``[K]``, one
    threshold per class (``+inf`` for a class given the ``'full'``
    fallback); ``predict_sets`` puts class :math:`y` in the set of ``x``
    when its score is at most ``qhat[y]`` (``labels[i] in
    predict_sets(...)[i]`` exactly when ``scores(...)[i] <=
    qhat[labels[i]]``, with ``allow_empty``).

    Attributes (beyond :class:`ConformalPredictor`'s):
      class_counts: int32 ``[K]`` calibration rows per class.
      absent: the fallback for classes with too few rows (``'error'``,
        ``'marginal'`` or ``'full'``).

    Examples:
      >>> import jax
      >>> from calib_jax import conformal
      >>> z = 2.0 * jax.random.normal(jax.random.key(0), (500, 4))
      >>> y = jax.random.categorical(jax.random.key(1), z)
      >>> pred = conformal.fit("thr", z, y, alpha=0.1, mondrian=True)
      >>> pred.qhat.shape, pred.predict_sets(z[:3]).shape
      ((4,), (3, 4))
    """

    class_counts: jax.Array | None = None
    absent: str = struct.field(pytree_node=False, default="error")

    def _row_sums(self, logits, class_sharded) -> bool:
        """Never the row sums: a Mondrian APS/RAPS set needs every class's
        score (see the module docstring); THR's is elementwise."""
        check_class_sharded(class_sharded)
        return False

    def _layout(self, logits, class_sharded):
        """:func:`rows_layout` of ``logits`` for APS/RAPS unless
        ``class_sharded`` is False; None (one program) otherwise."""
        self._row_sums(logits, class_sharded)
        if self.method == "thr" or class_sharded is False:
            return None
        return rows_layout(logits)

    def predict_sets(
        self,
        logits: jax.typing.ArrayLike,
        key: jax.Array | None = None,
        *,
        class_sharded: bool | None = None,
    ) -> jax.Array:
        """Class-conditional prediction sets of the rows of ``logits``.

        Args:
          logits: float ``[N, K]`` logits (the same kind as at fit).
          key: PRNG key of the per-row uniforms; required when
            ``randomized``, ignored otherwise.
          class_sharded: ``None`` (default) or True: APS/RAPS sets of logits
            whose class axis is split over devices are computed on whole
            rows after an all-to-all (see the module docstring), the same
            sets as on one device, on the input's sharding; other logits
            (one device, whole rows per device, or under an outer
            ``jax.jit``, where the placement is not visible) take the one
            program, with nothing to reshard. False: the one program always
            (XLA then gathers each row's classes to sort them). THR's sets
            are elementwise and work per class shard as they are.

        Returns:
          bool ``[N, K]``; class ``y`` is in row ``i``'s set when its
          conformity score is at most ``qhat[y]``.
        """
        logits = self._check(logits, key)
        layout = self._layout(logits, class_sharded)
        n = logits.shape[0]
        u = _predictor.uniforms(key, n, jnp.float32) if self.randomized else None
        return _sets_core(
            self.method,
            logits,
            self.qhat,
            u,
            self.lam,
            k_reg=self.k_reg,
            allow_empty=self.allow_empty,
            layout=layout,
        )

    def scores(
        self,
        logits: jax.typing.ArrayLike,
        labels: jax.typing.ArrayLike,
        key: jax.Array | None = None,
        *,
        class_sharded: bool | None = None,
    ) -> jax.Array:
        """Conformity scores ``[N]`` of ``labels`` by the sorted form, on
        whole rows after an all-to-all as :meth:`predict_sets` (so
        ``labels[i] in predict_sets(logits, key)[i]`` exactly when
        ``scores(logits, labels, key)[i] <= qhat[labels[i]]``, with
        ``allow_empty``)."""
        logits = self._check(logits, key)
        labels = _scores.check_labels(labels, *logits.shape)
        layout = self._layout(logits, class_sharded)
        n = logits.shape[0]
        u = _predictor.uniforms(key, n, jnp.float32) if self.randomized else None
        return _scores_core(
            self.method, logits, labels, u, self.lam, k_reg=self.k_reg, layout=layout
        )


def fit_mondrian(
    method: str,
    logits: jax.Array,
    labels: jax.Array,
    *,
    alpha: float,
    key: jax.Array | None = None,
    lam: float = 0.0,
    k_reg: int = 0,
    allow_empty: bool = True,
    absent: str = "error",
) -> MondrianPredictor:
    """Calibrates a Mondrian ``method`` on checked inputs (see
    :func:`calib_jax.conformal.fit` with ``mondrian=True``)."""
    _checks.check_choice("absent", absent, ABSENT)
    alpha = _scores.check_alpha(alpha)
    if absent == "error" and _checks.is_concrete(labels):
        check_class_counts(labels, logits.shape[1], alpha)
    # The fit needs no class's score but the label's: on class-sharded
    # logits, the labels' row-sum scores.
    scores, fitted = _predictor.calibration_scores(
        method,
        logits,
        labels,
        alpha=alpha,
        key=key,
        lam=lam,
        k_reg=k_reg,
        allow_empty=allow_empty,
    )
    return mondrian_of_scores(method, scores, labels, absent=absent, **fitted)


def mondrian_of_scores(
    method: str, scores: jax.Array, labels: jax.Array, *, absent: str, **fitted
) -> MondrianPredictor:
    """The Mondrian predictor of the ``n`` calibration ``scores`` (those of
    :func:`calib_jax.conformal._predictor.scores_core`) and their
    ``labels``, in any row order (the class counts are checked by the caller
    for ``absent='error'``); ``fitted``: the keyword arguments of
    :func:`calib_jax.conformal._predictor.predictor_fields`."""
    n, alpha = scores.shape[0], fitted["alpha"]
    qhat, counts = class_quantiles(
        scores,
        labels,
        rank_table(n, alpha),
        num_classes=int(fitted["num_classes"]),
        absent=absent,
        marginal_rank=_scores.quantile_rank(n, alpha),
    )
    return MondrianPredictor(
        qhat=qhat,
        class_counts=counts,
        absent=absent,
        **_predictor.predictor_fields(method, n, **fitted),
    )
