r"""Temperature scaling fitted over a sequence of chunks: :func:`fit_of_chunks`.

:func:`calib_jax.posthoc.fit` needs the whole ``[N, K]`` array of validation
logits; here it arrives a chunk at a time (:mod:`calib_jax.chunks`: an
iterable of arrays, or ``.npz``/``.npy`` shards, local or ``gs://``), and
memory stays bounded by one chunk.

Both objectives of temperature scaling fitted here are sums over rows, or
functions of per-bin sums over rows, so their value *and* their derivative in
:math:`u = \log T` at one :math:`u` come from one pass over the chunks: one
jitted step per chunk (compiled once: every chunk has the rows of the first,
the last one padded and masked) adds the chunk's share on the device, by
forward-mode differentiation in :math:`u` (:func:`jax.jvp`), and the host
fetches two scalars per pass.

- NLL (Guo et al. 2017): :math:`\sum_n \log S_n(e^{-u}) + e^{-u}(m_n -
  z_{ny_n})` (``_temperature.nll_of_log_t``) and its derivative, divided by
  :math:`N` at the end of the pass.
- SB-ECE (Karandikar et al. 2021, Eqs. (8)-(12)): the soft-binned ECE is a
  function of per-bin soft sums. Per bin :math:`j` a pass gathers the mass
  :math:`S_j = \sum_i u_{ij}`, :math:`\sum_i u_{ij}(1 - a_i)` (the bin
  accuracy :math:`A_j`, Eq. (10)), :math:`\sum_i u_{ij}(a_i - c_i)` (the
  gap of Eq. (11), ``sb_kind='bin'``) and the weighted mean and centred
  second moment of the confidences, merged across chunks by the pairwise
  update of Chan, Golub and LeVeque (1979). With :math:`p = 2` the
  ``'lb'`` sum of Eq. (12) is then :math:`\sum_j M_{2,j} + S_j (A_j -
  \bar c_j)^2`, without the cancellation of expanding the square. For
  ``'lb'`` with another :math:`p`, :math:`|A_j - c_i|^p` needs the bin
  accuracies first: an evaluation is then two passes (the first gives
  :math:`A_j` and :math:`dA_j/du`).

The optimizer is the in-memory fit's own: :func:`calib_jax.posthoc._core.lbfgs_minimize`
(``optax.lbfgs`` with its zoom line search, the same stopping rule), run with
``jax.disable_jit`` so that its ``lax.while_loop`` runs on the host and each
objective evaluation it asks for is a pass over the chunks (the per-chunk
steps stay compiled). Its iterates are those of the in-memory fit up to the
float32 rounding of the sums, which are added in another order; the fitted
temperature equals :func:`calib_jax.posthoc.fit`'s to about 1e-6 relative.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from calib_jax import _checks, chunks, losses, progress
from calib_jax.losses._base import safe_pow
from calib_jax.posthoc import _calibrator, _core, _methods, _temperature, _validate

#: The registry names :func:`fit_of_chunks` fits.
STREAMED = ("ts", "ts:nll", "ts:sb_ece")


# ---------------------------------------------------------------------------
# Per-chunk steps (jitted; compiled once per chunk shape)
# ---------------------------------------------------------------------------


def _upcast(x):
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


@jax.jit
def _chunk_checks(x, labels, valid):
    """``(bad rows, first bad row, correct rows, simplex)`` of one chunk:
    NaN/inf logits in an included row, the arg-max correctness (the
    library's rule) and whether its first rows look like probabilities."""
    z = _upcast(x)
    bad = valid & ~jnp.all(jnp.isfinite(z), axis=1)
    correct = valid & (jnp.argmax(z, axis=1) == labels)
    return (
        jnp.sum(bad.astype(jnp.int32)),
        jnp.argmax(bad),
        jnp.sum(correct.astype(jnp.int32)),
        _validate.simplex_rows(z, valid),
    )


def _row_constants(x, labels, valid):
    """Zeroed padding, row maxima and ``m - z_y`` of a chunk (as ``_core.canonical``)."""
    z = jnp.where(valid[:, None], _upcast(x), 0.0)
    labels = jnp.where(valid, labels, 0)
    m = jnp.max(z, axis=1)
    return z, labels, m, m - _core.pick(z, labels)


@jax.jit
def _nll_step(carry, u, x, labels, valid):
    """``carry + (sum, d sum / du)`` of the chunk's NLL rows at ``u = log T``."""
    z, labels, m, a = _row_constants(x, labels, valid)
    w = valid.astype(z.dtype)
    value, slope = jax.jvp(
        lambda v: _temperature.nll_of_log_t(v, z, m, a, w), (u,), (jnp.ones_like(u),)
    )
    return carry[0] + value, carry[1] + slope


def _empty_bins(num_bins, dtype=jnp.float32):
    """Per-bin soft sums of no rows: mass ``s``, ``r = sum u(1 - a)``,
    ``g = sum u(a - c)``, the mean confidence ``mu`` and ``m2 = sum u(c - mu)^2``."""
    zeros = jnp.zeros((num_bins,), dtype)
    return {"s": zeros, "r": zeros, "g": zeros, "mu": zeros, "m2": zeros}


def _safe_ratio(num, den):
    """``num / den`` where ``den > 0``, else 0 (finite derivatives either way)."""
    pos = den > 0
    return jnp.where(pos, num / jnp.where(pos, den, 1.0), 0.0)


def _merge_bins(a, b):
    """Per-bin sums of two sets of rows: sums add; mean and centred second
    moment by the pairwise update (Chan, Golub and LeVeque 1979)."""
    s = a["s"] + b["s"]
    share = _safe_ratio(b["s"], s)
    delta = b["mu"] - a["mu"]
    return {
        "s": s,
        "r": a["r"] + b["r"],
        "g": a["g"] + b["g"],
        "mu": a["mu"] + delta * share,
        "m2": a["m2"] + b["m2"] + delta * delta * a["s"] * share,
    }


def _chunk_confidences(u, x, labels, valid, num_bins, sb_temperature):
    """Top-label confidences of ``z / e^u``, correctness and soft memberships
    (zero on padding rows) of a chunk, as ``_temperature.sb_ece_objective``."""
    z, labels, m, _ = _row_constants(x, labels, valid)
    correct = (jnp.argmax(z, axis=1) == labels).astype(z.dtype)
    conf = _temperature.top_confidence_of_log_t(u, z, m)
    member = losses.soft_bin_membership(conf, num_bins, sb_temperature)
    return conf, correct, jnp.where(valid[:, None], member, 0.0)


def _chunk_bins(u, x, labels, valid, num_bins, sb_temperature):
    """The per-bin soft sums (:func:`_empty_bins`) of one chunk."""
    conf, correct, member = _chunk_confidences(
        u, x, labels, valid, num_bins, sb_temperature
    )
    s = jnp.sum(member, axis=0)
    mu = _safe_ratio(jnp.sum(member * conf[:, None], axis=0), s)
    return {
        "s": s,
        "r": jnp.sum(member * (1.0 - correct)[:, None], axis=0),
        "g": jnp.sum(member * (correct - conf)[:, None], axis=0),
        "mu": mu,
        "m2": jnp.sum(member * (conf[:, None] - mu[None, :]) ** 2, axis=0),
    }


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _bins_step(carry, u, x, labels, valid, sb_temperature, *, num_bins):
    """``(bins, d bins / du)`` merged with the chunk's, at ``u = log T``."""

    def merged(bins, v):
        part = _chunk_bins(v, x, labels, valid, num_bins, sb_temperature)
        return _merge_bins(bins, part)

    return jax.jvp(merged, (carry[0], u), (carry[1], jnp.ones_like(u)))


def _occupied(s):
    """Bins of non-negligible mass (as ``losses.sb_ece_from_confidences``)."""
    return s > jnp.sqrt(jnp.finfo(s.dtype).tiny)


def _bin_accuracy(s, r):
    """:math:`A_j = 1 - \\sum_i u_{ij}(1 - a_i) / S_j` (Eq. (10))."""
    return 1.0 - r / jnp.where(_occupied(s), s, 1.0)


@functools.partial(jax.jit, static_argnames=("num_bins",))
def _lb_step(carry, u, acc, dacc, x, labels, valid, sb_temperature, p, *, num_bins):
    """``carry + (sum, d sum / du)`` of the chunk's Eq. (12) terms
    :math:`\\sum_{ij} u_{ij} |A_j - c_i|^p` at given bin accuracies ``acc``
    (their derivative in ``u``: ``dacc``)."""

    def total(v, bin_acc):
        conf, _, member = _chunk_confidences(
            v, x, labels, valid, num_bins, sb_temperature
        )
        dev = safe_pow(jnp.abs(bin_acc[None, :] - conf[:, None]), p)
        return jnp.sum(member * dev, axis=0)

    value, slope = jax.jvp(total, (u, acc), (jnp.ones_like(u), dacc))
    return carry[0] + value, carry[1] + slope


def _sb_value(bins, count, p, kind):
    """SB-ECE (Eqs. (11)-(12)) from the per-bin sums of every row (p = 2 for
    ``'lb'``)."""
    s = bins["s"]
    occupied = _occupied(s)
    if kind == "bin":
        gap = bins["g"] / jnp.where(occupied, s, 1.0)
        total = jnp.sum(jnp.where(occupied, s * safe_pow(jnp.abs(gap), p), 0.0))
    else:
        dev = _bin_accuracy(s, bins["r"]) - bins["mu"]
        total = jnp.sum(jnp.where(occupied, bins["m2"] + s * dev * dev, 0.0))
    return safe_pow(total / count, 1.0 / p)


@functools.partial(jax.jit, static_argnames=("kind",))
def _sb_finish(bins, dbins, count, p, *, kind):
    """``(value, d value / du)`` of SB-ECE from the merged bins and their tangent."""
    return jax.jvp(lambda b: _sb_value(b, count, p, kind), (bins,), (dbins,))


@jax.jit
def _accuracy_of_bins(bins, dbins):
    """``(A, dA/du, occupied)`` of the merged bins (the first ``'lb'`` pass)."""
    acc, dacc = jax.jvp(
        lambda s, r: _bin_accuracy(s, r),
        (bins["s"], bins["r"]),
        (dbins["s"], dbins["r"]),
    )
    return acc, dacc, _occupied(bins["s"])


@jax.jit
def _lb_finish(total, dtotal, occupied, count, p):
    """``(value, d value / du)`` of Eq. (12) from the per-bin totals."""

    def value(t):
        return safe_pow(jnp.sum(jnp.where(occupied, t, 0.0)) / count, 1.0 / p)

    return jax.jvp(value, (total,), (dtotal,))


# ---------------------------------------------------------------------------
# Passes over the chunks
# ---------------------------------------------------------------------------


class _Passes:
    """Passes over a chunk source; the first one also checks the values.

    Each pass carries its sums on the device (one jitted step per chunk) and
    fetches nothing until it ends. The first pass also runs
    :func:`_chunk_checks` per chunk and raises, once it has read every
    chunk, the one-line ValueError naming the first row (shard, row, chunk)
    with NaN/inf logits, before the fit returns anything.
    """

    def __init__(self, source: chunks.ChunkSource, *, desc: str, bar):
        self.source = source
        self.desc = desc
        self.bar = bar  # the bar over passes
        self.rows = self.num_classes = None
        self.count = self.correct = None
        self.simplex = False
        self.passes = 0

    def run(self, step, carry):
        """``carry`` after ``step(carry, x, labels, valid)`` over every chunk."""
        self.passes += 1
        checks = [] if self.count is None else None
        bar = progress.bar(
            self.source.num_chunks,
            desc=f"{self.desc} pass {self.passes}",
            unit="chunk",
            enabled=not self.bar.disable,
            level=1,
        )
        with bar:
            for chunk in self.source:
                x, labels, valid = self._padded(chunk)
                if checks is not None:
                    spans = chunk._replace(x=None, labels=None)
                    checks.append((spans, _chunk_checks(x, labels, valid), valid.sum()))
                previous, carry = carry, step(carry, x, labels, valid)
                # One step in flight while the host reads the next chunk: its
                # temporaries (a few [rows, K] float32 arrays) and two chunks
                # are the memory bound.
                jax.block_until_ready(previous)
                bar.update(1)
        if checks is not None:
            self._raise_for_checks(checks)
        self.bar.update(1)
        return carry

    def _padded(self, chunk):
        n, k = chunk.x.shape
        if self.rows is None:
            if k < 2:
                raise ValueError(
                    f"{chunk.where(0)}: the logits have K = {k} class(es); "
                    "temperature scaling needs K >= 2 classes."
                )
            self.rows, self.num_classes = n, k
        labels = np.asarray(chunk.labels).astype(np.int32, copy=False)
        if n == self.rows:
            return chunk.x, labels, np.ones((n,), bool)
        x = np.zeros((self.rows, k), chunk.x.dtype)
        x[:n] = chunk.x
        return x, np.pad(labels, (0, self.rows - n)), np.arange(self.rows) < n

    def _raise_for_checks(self, checks) -> None:
        fetched = jax.device_get([c for _, c, _ in checks])
        for (chunk, _, _), (bad, first, _, _) in zip(checks, fetched):
            if bad:
                raise ValueError(
                    f"{chunk.where(int(first))}: logits contain NaN or inf "
                    f"({int(bad)} row(s) of the chunk); expected finite logits."
                )
        self.count = int(sum(int(n) for _, _, n in checks))
        self.correct = int(sum(int(c[2]) for c in fetched))
        self.simplex = bool(fetched[0][3])


# The points each running fit asked for and the table lacked, by fit token.
_MISSES: dict[int, list[float]] = {}
_TOKENS = itertools.count()
# Evaluations the first table holds (it doubles when full).
_TABLE_SIZE = 32


def _record_miss(token, u):
    _MISSES[int(token)].append(float(u))
    return np.zeros((), np.int32)


@jax.jit
def _replay(points, values, slopes, filled, u0, tol, max_iter, token):
    """:func:`_core.lbfgs_minimize` from ``u0`` on a table of evaluations.

    The objective is looked up in the first ``filled`` entries of
    ``(points, values, slopes)`` (value and derivative at ``u = log T``,
    matched bit for bit). A point the table lacks is reported to the host
    (:func:`_record_miss`) and gives NaN, which ends the run. The run is
    deterministic, so once the host has added that point, the next run
    repeats every step up to it and goes on: the last run, with no miss, is
    the L-BFGS of the in-memory fit on the objective the passes computed.
    """

    def look(u):
        hit = (points == u) & (jnp.arange(points.shape[0]) < filled)
        found = jnp.any(hit)
        i = jnp.argmax(hit)
        jax.lax.cond(
            found,
            lambda: jnp.zeros((), jnp.int32),
            lambda: io_callback(
                _record_miss,
                jax.ShapeDtypeStruct((), jnp.int32),
                token,
                u,
                ordered=True,
            ),
        )
        nan = jnp.full((), jnp.nan, values.dtype)
        return jnp.where(found, values[i], nan), jnp.where(found, slopes[i], nan)

    @jax.custom_jvp
    def objective(u):
        return look(u)[0]

    @objective.defjvp
    def _(primals, tangents):
        value, slope = look(primals[0])
        return value, slope * tangents[0]

    u, _ = _core.lbfgs_minimize(objective, u0, max_iter=max_iter, gtol=tol)
    return u


def _minimize(evaluate, u0, *, max_iter, tol):
    """L-BFGS (the in-memory fit's) of ``evaluate: u -> (value, d/du)``, whose
    every call is a pass over the chunks, from ``u0``; returns ``u``.

    Runs :func:`_replay` until it asks for no new point: one pass per
    distinct point the optimizer evaluates, one cheap compiled run (scalar
    work) per pass.
    """
    token = next(_TOKENS)
    misses = _MISSES[token] = []
    size = _TABLE_SIZE
    table = np.zeros((3, size), np.float32)
    # The first point the optimizer asks for is u0: evaluated before any run
    # (the first pass of a fit checks the values before anything compiles).
    u0 = jnp.asarray(u0, jnp.float32)
    table[:, 0] = u0, *jax.device_get(evaluate(u0))
    filled = 1
    try:
        while True:
            misses.clear()
            u = _replay(*table, filled, u0, tol, max_iter, token)
            jax.block_until_ready(u)
            jax.effects_barrier()
            if not misses:
                return u
            point = np.float32(misses[0])
            value, slope = jax.device_get(evaluate(jnp.asarray(point)))
            if filled == size:
                size *= 2
                table = np.concatenate([table, np.zeros_like(table)], axis=1)
            table[:, filled] = point, value, slope
            filled += 1
    finally:
        del _MISSES[token]


def _nll_objective(passes: _Passes):
    def evaluate(u):
        zero = jnp.zeros((), u.dtype)
        total, slope = passes.run(
            lambda c, x, y, v: _nll_step(c, u, x, y, v), (zero, zero)
        )
        n = jnp.asarray(passes.count, u.dtype)
        return total / n, slope / n

    return evaluate


def _sb_ece_objective(passes, *, num_bins, sb_temperature, p, kind):
    one_pass = kind == "bin" or p == 2.0

    def evaluate(u):
        empty = _empty_bins(num_bins, u.dtype)
        bins, dbins = passes.run(
            lambda c, x, y, v: _bins_step(
                c, u, x, y, v, sb_temperature, num_bins=num_bins
            ),
            (empty, empty),
        )
        count = jnp.asarray(passes.count, u.dtype)
        if one_pass:
            return _sb_finish(bins, dbins, count, p, kind=kind)
        acc, dacc, occupied = _accuracy_of_bins(bins, dbins)
        zero = jnp.zeros((num_bins,), u.dtype)
        total, dtotal = passes.run(
            lambda c, x, y, v: _lb_step(
                c, u, acc, dacc, x, y, v, sb_temperature, p, num_bins=num_bins
            ),
            (zero, zero),
        )
        return _lb_finish(total, dtotal, occupied, count, p)

    return evaluate


# ---------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------


def _check_reiterable(source) -> None:
    items = source._items if isinstance(source, chunks.ChunkSource) else source
    if isinstance(items, Iterator):
        raise ValueError(
            "source is an iterator, read once; fitting a temperature takes "
            "several passes over the chunks: pass a list of (logits, labels) "
            "pairs, a ChunkSource of shards, or shard paths."
        )


def fit_of_chunks(
    name: str,
    source,
    *,
    chunk_rows: int = chunks.DEFAULT_CHUNK_ROWS,
    progress_bar: bool = True,
    max_iter: int = 100,
    tol: float = 1e-6,
    num_bins: int = 15,
    p: float | None = None,
    sb_temperature: float = 0.01,
    sb_kind: str = "lb",
) -> _calibrator.Calibrator:
    r"""Temperature scaling fitted on logits that arrive in chunks.

    The :class:`~calib_jax.posthoc.Calibrator` that
    ``posthoc.fit(name, logits, labels)`` returns for the concatenation of
    every chunk (same name, parameters, ``apply`` and ``save``), with memory
    bounded by one chunk of ``chunk_rows`` rows. Each value and derivative
    of the objective that the optimizer asks for is one pass over the chunks
    (two for ``'lb'`` SB-ECE with ``p != 2``); see the module docstring.

    ``'ts'``/``'ts:nll'`` (Guo et al. 2017, Sec. 4.2 of [1]):
      :math:`\min_T \frac{1}{N}\sum_n -\log\mathrm{softmax}(z_n/T)_{y_n}` by
      L-BFGS on :math:`u = \log T` from :math:`T = 1`, stopping at
      ``max_iter`` iterations or when :math:`|\partial/\partial u| \le`
      ``tol`` (the optimizer of :func:`~calib_jax.posthoc.fit_temperature`).
    ``'ts:sb_ece'`` (TS-SB-ECE, Sec. 5.2 and App. C of [2]):
      :math:`\min_T \mathrm{SB\text{-}ECE}_{\mathrm{lb},p}(M, T_{\mathrm{sb}})`
      of :math:`z/T` (Eq. (12) of [2]; Eq. (11) with ``sb_kind='bin'``) by
      the same L-BFGS, started from the NLL temperature, as the in-memory fit.

    The temperature equals the in-memory fit's to float32 rounding (the sums
    are added in another order): within 1e-5 relative in the tests, from
    bf16 and float32 logits.

    Args:
      name: ``'ts'``, ``'ts:nll'`` or ``'ts:sb_ece'`` (other calibrators are
        fitted in memory by :func:`calib_jax.posthoc.fit`).
      source: a :class:`calib_jax.chunks.ChunkSource`; or what it takes: a
        list (any re-iterable) of ``(logits [n, K], labels [n])`` pairs, a
        glob string or a list of ``.npz``/``.npy`` shard paths, local or
        ``gs://`` (layout in :mod:`calib_jax.chunks`). Logits may be bf16,
        fp16 or float32. An iterator is refused: the fit reads the chunks
        several times.
      chunk_rows: rows per chunk (a given ``ChunkSource`` keeps its own).
      progress_bar: a bar over the passes and, under it, one over the chunks
        of each pass (on stderr).
      max_iter: L-BFGS iteration cap (each objective fit).
      tol: gradient tolerance in :math:`\log T`.
      num_bins: number of soft bins :math:`M` (``'ts:sb_ece'``).
      p: norm order of SB-ECE; None = 2 (``'ts:sb_ece'``).
      sb_temperature: soft-binning temperature :math:`T_{\mathrm{sb}}`.
      sb_kind: ``'lb'`` (Eq. (12)) or ``'bin'`` (Eq. (11)).

    Returns:
      A :class:`~calib_jax.posthoc.Calibrator` named ``'ts:nll'`` or
      ``'ts:sb_ece'`` with ``params = {'temperature': float32 scalar}``.

    Raises:
      ValueError: a name other than those above, a bad option, an iterator
        source, and (one line naming the shard or item, the row and what was
        expected, before any result) a glob that matches nothing, shards
        whose classes or dtypes disagree, labels outside ``[0, K)``, NaN/inf
        logits, ``K < 2``.

    Warns:
      SuspiciousFitWarning: one line when the validation accuracy is below
        chance (1/K), the first rows look like probabilities, or :math:`T`
        lies outside [0.05, 20] (as :func:`~calib_jax.posthoc.fit`).

    References:
      [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, "On Calibration of
      Modern Neural Networks", ICML 2017, arXiv:1706.04599v2, Sec. 4.2.
      [2] A. Karandikar et al., "Soft Calibration Objectives for Neural
      Networks", NeurIPS 2021, arXiv:2108.00106, Eqs. (8)-(12), Sec. 5.2,
      App. C.

    Examples:
      >>> import numpy as np
      >>> from calib_jax import posthoc
      >>> rng = np.random.default_rng(0)
      >>> z = (3.0 * rng.standard_normal((600, 5))).astype(np.float32)
      >>> y = (z / 3.0 + rng.gumbel(size=z.shape)).argmax(axis=1)
      >>> pairs = [(z[:250], y[:250]), (z[250:], y[250:])]
      >>> cal = posthoc.fit_of_chunks("ts", pairs, chunk_rows=128,
      ...                             progress_bar=False)
      >>> print(cal.name, f"{float(cal.params['temperature']):.3f}")
      ts:nll 3.206
    """
    if name not in STREAMED:
        raise ValueError(
            f"fit_of_chunks fits {', '.join(repr(n) for n in STREAMED)} over "
            f"chunks, got {name!r}; fit other calibrators in memory with "
            "posthoc.fit."
        )
    objective = "nll" if name == "ts" else name[3:]
    max_iter = _checks.check_positive_int("max_iter", max_iter)
    _checks.check_nonnegative("tol", tol)
    num_bins = _checks.check_num_bins(num_bins)
    _checks.check_choice("sb_kind", sb_kind, ("lb", "bin"))
    _checks.check_positive("sb_temperature", sb_temperature)
    if p is not None and not float(p) >= 1:
        raise ValueError(f"p must be >= 1, got {p}.")
    p = 2.0 if p is None else float(p)
    _check_reiterable(source)
    source = chunks.as_source(
        source,
        chunk_rows=chunk_rows,
        key="logits",
        check_finite=False,  # checked on the device in the first pass
        progress_bar=False,  # the fit draws its own bars
    )
    desc = f"fit ts:{objective}"
    outer = progress.bar(None, desc=desc, unit="pass", enabled=progress_bar)
    with outer:
        passes = _Passes(source, desc=desc, bar=outer)
        dtype = jnp.float32
        u = _minimize(
            _nll_objective(passes), jnp.zeros((), dtype), max_iter=max_iter, tol=tol
        )
        if objective == "sb_ece":
            u = _minimize(
                _sb_ece_objective(
                    passes,
                    num_bins=num_bins,
                    sb_temperature=jnp.asarray(sb_temperature, dtype),
                    p=p,
                    kind=sb_kind,
                ),
                u,
                max_iter=max_iter,
                tol=tol,
            )
    t = jnp.exp(u).astype(jnp.float32)
    _warn_if_suspicious(name, passes, t)
    return _calibrator.Calibrator(
        {"temperature": t}, None, f"ts:{objective}", _methods.MAPS["ts"].apply
    )


def _warn_if_suspicious(name, passes: _Passes, t) -> None:
    """The :class:`SuspiciousFitWarning` of :func:`posthoc.fit`, from the
    first pass's accuracy and simplex flag."""
    message = _validate.suspicious_fit_message(
        np.empty((0, passes.num_classes)),
        None,
        temperatures=t,
        accuracy=passes.correct / max(passes.count, 1),
        simplex=passes.simplex,
    )
    if message:
        warnings.warn(
            f"calibrator {name!r}: {message}.",
            _validate.SuspiciousFitWarning,
            stacklevel=3,
        )
