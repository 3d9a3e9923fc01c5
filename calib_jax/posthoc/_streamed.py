"""Temperature scaling fitted over chunks (:func:`fit_of_chunks`): one pass over
them per evaluation of the objective, the in-memory L-BFGS replayed over these
evaluations (:mod:`._replay`). Design and exactness: ``docs/streaming.md``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from calib_jax import _checks, chunks, progress
from calib_jax.posthoc import _calibrator, _chunk_steps, _log_t_search, _methods
from calib_jax.posthoc import _replay, _temperature_fit, _validate

#: The registry names :func:`fit_of_chunks` fits.
STREAMED = ("ts", "ts:nll", "ts:sb_ece")


class _Passes:
    """Passes over a chunk source, sums kept on the device; the first pass
    also checks the values and raises for the first row with NaN/inf logits."""

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
                    checks.append(
                        (
                            spans,
                            _chunk_steps.chunk_checks(x, labels, valid),
                            valid.sum(),
                        )
                    )
                previous, carry = carry, step(carry, x, labels, valid)
                # One step in flight while the host reads the next chunk.
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
        return chunks.padded(chunk, self.rows)

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


def _nll_objective(passes: _Passes):
    def evaluate(u):
        zero = jnp.zeros((), u.dtype)
        total, slope = passes.run(
            lambda c, x, y, v: _chunk_steps.nll_step(c, u, x, y, v), (zero, zero)
        )
        n = jnp.asarray(passes.count, u.dtype)
        return total / n, slope / n

    return evaluate


def _sb_ece_objective(passes, *, num_bins, sb_temperature, p, kind):
    one_pass = kind == "bin" or p == 2.0

    def evaluate(u):
        empty = _chunk_steps.empty_bins(num_bins, u.dtype)
        bins, dbins = passes.run(
            lambda c, x, y, v: _chunk_steps.bins_step(
                c, u, x, y, v, sb_temperature, num_bins=num_bins
            ),
            (empty, empty),
        )
        count = jnp.asarray(passes.count, u.dtype)
        if one_pass:
            return _chunk_steps.sb_finish(bins, dbins, count, p, kind=kind)
        acc, dacc, occupied = _chunk_steps.accuracy_of_bins(bins, dbins)
        zero = jnp.zeros((num_bins,), u.dtype)
        total, dtotal = passes.run(
            lambda c, x, y, v: _chunk_steps.lb_step(
                c, u, acc, dacc, x, y, v, sb_temperature, p, num_bins=num_bins
            ),
            (zero, zero),
        )
        return _chunk_steps.lb_finish(total, dtotal, occupied, count, p)

    return evaluate


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
    bounded by one chunk of ``chunk_rows`` rows. Each evaluation of the
    objective is one pass over the chunks (two for ``'lb'`` SB-ECE with
    ``p != 2``); design: ``docs/streaming.md``.

    ``'ts'``/``'ts:nll'`` (Guo et al. 2017, Sec. 4.2 of [1]):
      :math:`\min_T \frac{1}{N}\sum_n -\log\mathrm{softmax}(z_n/T)_{y_n}` by
      L-BFGS on :math:`u = \log T` from :math:`T = 1`, stopping at
      ``max_iter`` iterations or when :math:`|\partial/\partial u| \le`
      ``tol`` (the optimizer of :func:`~calib_jax.posthoc.fit_temperature`).
    ``'ts:sb_ece'`` (TS-SB-ECE, Sec. 5.2 and App. C of [2]):
      :math:`\min_T \mathrm{SB\text{-}ECE}_{\mathrm{lb},p}(M, T_{\mathrm{sb}})`
      of :math:`z/T` (Eq. (12) of [2]; Eq. (11) with ``sb_kind='bin'``) by
      the same L-BFGS and derivative root search, started from the NLL
      temperature, as the in-memory fit.

    The temperature equals the in-memory fit's to float32 rounding (the sums
    are added in another order).

    Args:
      name: ``'ts'``, ``'ts:nll'`` or ``'ts:sb_ece'`` (other calibrators are
        fitted in memory by :func:`calib_jax.posthoc.fit`).
      source: a :class:`calib_jax.chunks.ChunkSource` or what it takes: a
        re-iterable of ``(logits [n, K], labels [n])`` pairs, a glob string
        or a list of ``.npz``/``.npy`` shard paths, local or ``gs://``.
        Logits may be bf16, fp16 or float32. Iterators are refused.
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
        source, and (one line naming the shard, row and expectation) a glob
        that matches nothing, shards whose classes or dtypes disagree, labels
        outside ``[0, K)``, NaN/inf logits, ``K < 2``.

    Warns:
      SuspiciousFitWarning: as :func:`~calib_jax.posthoc.fit`.

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
    p = float(_temperature_fit.check_sb_options(p, sb_temperature, sb_kind))
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
        u = _replay.minimize(
            _nll_objective(passes), jnp.zeros((), dtype), max_iter=max_iter, tol=tol
        )
        if objective == "sb_ece":
            u = _replay.minimize(
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
                minimizer=_log_t_search.minimize_log_t,
            )
    t = jnp.exp(u).astype(jnp.float32)
    _warn_if_suspicious(name, passes, t)
    return _calibrator.Calibrator(
        {"temperature": t}, None, f"ts:{objective}", _methods.MAPS["ts"].apply
    )


def _warn_if_suspicious(name, passes: _Passes, t) -> None:
    """The :class:`SuspiciousFitWarning` of :func:`posthoc.fit`."""
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
