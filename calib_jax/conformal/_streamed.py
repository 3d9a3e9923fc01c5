r"""Split-conformal calibration over a sequence of chunks: :func:`fit_of_chunks`.

:func:`calib_jax.conformal.fit` needs the calibration logits ``[n, K]`` in
one array; here they arrive a chunk at a time (:mod:`calib_jax.chunks`: an
iterable of ``(logits, labels)`` pairs, or ``.npz``/``.npy`` shards, local or
``gs://``), and memory is bounded by one chunk plus ``O(n)`` per-row scalars:

- per chunk, the jitted scoring function of the in-memory fit (the same
  code: the float32 softmax of the chunk's rows, then THR's, APS's or RAPS's
  conformity score of the labelled class) gives the ``[rows]`` scores on the
  device; the last chunk is padded (and its padding dropped), so it compiles
  once;
- the ``n`` scores (and, for a Mondrian predictor, the labels) are kept,
  4 bytes a row each, and the threshold is then computed once, by the very
  function of the in-memory fit: the exact order statistic of rank
  :math:`\lceil (n+1)(1-\alpha) \rceil` (per class for Mondrian, Vovk et al.
  2005). An order statistic has no mergeable form, so the scores are kept
  rather than summarised; they are ``O(n)``, never ``O(n K)``.

Randomised APS/RAPS (``key``) draw one uniform per row, the row's entry of
``jax.random.uniform(key, (n,))`` exactly as the in-memory fit: for shards,
whose row count the headers give, the ``n`` uniforms are drawn once; for an
iterable, whose ``n`` is known only at its end, they are drawn for a growing
prefix (doubling), which gives the same values because threefry's
partitionable bits (``jax_threefry_partitionable``, the default) make
entry ``i`` depend on ``(key, i)`` only.

The threshold equals the in-memory fit's on the concatenated logits bit for
bit: each row's score is computed by the same jitted function, and XLA:CPU
computes the exponentials of arrays under about 4,800 entries on another code
path than larger ones (``calib_jax.metrics._streamed`` documents it), so a
chunk is padded to at least :data:`MIN_ENTRIES` entries, and an input smaller
than that in all is scored in one call, as the in-memory fit scores it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from calib_jax import _checks, chunks
from calib_jax.conformal import _mondrian, _predictor, _registry, _scores

# Chunks are padded to at least this many entries: XLA:CPU computes the
# exponentials of smaller arrays on another code path (last-ulp differences
# from the whole array's under about 4,800 entries).
MIN_ENTRIES = 8192

# The options of each method (name -> default), as its fitter takes them.
_COMMON = {"allow_empty": True, "mondrian": False, "absent": None}
OPTIONS = {
    "thr": _COMMON,
    "aps": _COMMON,
    "raps": {**_COMMON, "lam": 0.1, "k_reg": 1},
}


def _options(name, kwargs) -> dict:
    """The method's options, defaults filled in and values checked."""
    if not isinstance(name, str) or name not in OPTIONS:
        _registry.get_predictor(name)  # raises, listing the known methods
    allowed = OPTIONS[name]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option for conformal method {name!r}: {', '.join(unknown)} "
            f"(its options: {', '.join(allowed)})."
        )
    options = {**allowed, **kwargs}
    options["mondrian"] = _checks.check_bool("mondrian", options["mondrian"])
    options["absent"] = _registry.check_absent(options["mondrian"], options["absent"])
    options.setdefault("lam", 0.0)
    options.setdefault("k_reg", 0)
    options["k_reg"] = _scores.check_k_reg(options["k_reg"])
    _registry.check_lam(options["lam"])
    return options


def prefix_uniforms(key) -> bool:
    """True when ``jax.random.uniform(key, (m,))`` is a prefix of the draw of
    any longer length (threefry2x32 keys with partitionable bits)."""
    return bool(jax.config.jax_threefry_partitionable) and (
        str(jax.random.key_impl(key)) == "threefry2x32"
    )


@functools.partial(jax.jit, static_argnames="rows")
def _window(u, start, *, rows):
    return lax.dynamic_slice_in_dim(u, start, rows)


class _Uniforms:
    """The per-row uniforms of the in-memory fit, a window of rows at a time."""

    def __init__(self, key, num_rows: int | None):
        self.key, self.num_rows = key, num_rows
        self.u = None

    def take(self, start: int, rows: int) -> jax.Array:
        need = start + rows
        if self.u is None or self.u.shape[0] < need:
            if self.num_rows is not None:  # the in-memory draw, padded
                u = _predictor.uniforms(self.key, self.num_rows, jnp.float32)
                self.u = jnp.concatenate([u, jnp.zeros((rows,), jnp.float32)])
            else:  # a prefix of it, doubled as rows arrive
                size = max(need, 2 * (0 if self.u is None else self.u.shape[0]))
                self.u = _predictor.uniforms(self.key, size, jnp.float32)
        return _window(self.u, start, rows=rows)


@jax.jit
def _nonfinite(x, valid):
    """``(count, first)`` of the included rows of ``x`` holding NaN or inf."""
    bad = valid & ~jnp.all(jnp.isfinite(x), axis=1)
    return jnp.sum(bad.astype(jnp.int32)), jnp.argmax(bad)


def _collect(chunk, scores, checks, out) -> None:
    """Appends the chunk's scores to ``out``; a one-line ValueError for NaN/inf."""
    scores, (count, first) = jax.device_get((scores, checks))
    if count:
        raise ValueError(
            f"{chunk.where(int(first))}: logits contain NaN or inf ({int(count)} "
            "row(s) of the chunk); expected finite logits."
        )
    out.append(scores[: chunk.x.shape[0]])


def fit_of_chunks(
    name: str,
    source,
    *,
    alpha: float,
    key: jax.Array | None = None,
    chunk_rows: int = chunks.DEFAULT_CHUNK_ROWS,
    progress_bar: bool = True,
    **kwargs,
) -> _predictor.ConformalPredictor:
    r""":func:`calib_jax.conformal.fit` of calibration logits that arrive in chunks.

    The same predictor as ``conformal.fit(name, logits, labels, alpha=alpha,
    key=key, **kwargs)`` on the concatenation of the chunks, with memory
    bounded by one chunk (``chunk_rows`` rows of ``K`` classes and their
    float32 softmax) plus 4 bytes per calibration row (8 for ``mondrian``):
    the threshold(s) are equal bit for bit, randomised variants included.
    The scores, the rank :math:`\lceil (n+1)(1-\alpha) \rceil` and the
    coverage guarantee are those of :func:`calib_jax.conformal.fit`
    (Lei et al. 2018, Thm. 2.2; Romano et al. 2020; Angelopoulos et al. 2021).

    Args:
      name: ``'thr'``, ``'aps'`` or ``'raps'``.
      source: a :class:`calib_jax.chunks.ChunkSource`; or what it takes: an
        iterable of ``(logits [n, K], labels [n])`` pairs, a glob string or a
        list of ``.npz`` (array ``logits``) or ``.npy`` shard paths, local
        or ``gs://`` (layout in :mod:`calib_jax.chunks`). Logits may be
        bf16, fp16 or float32.
      alpha: miscoverage level in (0, 1); needs :math:`n \ge 1/\alpha - 1`.
      key: PRNG key of the randomised APS/RAPS scores (the uniforms of the
        in-memory fit, row for row); ``None``: non-randomised.
      chunk_rows: rows per chunk (a given ``ChunkSource`` keeps its own).
      progress_bar: a bar over the chunks on stderr.
      **kwargs: the options of :func:`calib_jax.conformal.fit`
        (``allow_empty``, ``mondrian``, ``absent``; RAPS ``lam``, ``k_reg``).

    Returns:
      A :class:`~calib_jax.conformal.ConformalPredictor` (a
      :class:`~calib_jax.conformal.MondrianPredictor` with ``mondrian=True``).

    Raises:
      ValueError: one line, before a predictor is returned: an unknown
        method or option, ``alpha`` outside (0, 1), the input errors of
        :mod:`calib_jax.chunks` naming the shard or item (a glob matching
        nothing, ``K`` or dtype differing between shards, labels outside
        ``[0, K)``), NaN/inf logits (naming the shard and row), ``K < 2``,
        too few rows for ``alpha``, and with ``mondrian=True`` and
        ``absent='error'`` a class with too few rows.

    Examples:
      >>> import numpy as np
      >>> from calib_jax import conformal
      >>> rng = np.random.default_rng(0)
      >>> z = rng.normal(0.0, 3.0, (1000, 10)).astype(np.float32)
      >>> y = rng.integers(0, 10, 1000)
      >>> pairs = [(z[:600], y[:600]), (z[600:], y[600:])]
      >>> streamed = conformal.fit_of_chunks(
      ...     "thr", pairs, alpha=0.1, chunk_rows=500, progress_bar=False
      ... )
      >>> bool(streamed.qhat == conformal.fit("thr", z, y, alpha=0.1).qhat)
      True
    """
    options = _options(name, kwargs)
    alpha = _scores.check_alpha(alpha)
    mondrian, lam = options["mondrian"], jnp.asarray(options["lam"], jnp.float32)
    k_reg = options["k_reg"]
    source = chunks.as_source(
        source,
        chunk_rows=chunk_rows,
        key="logits",
        check_finite=False,  # checked on the device, per chunk
        progress_bar=progress_bar,
        desc=f"conformal {name}",
    )
    randomized = key is not None and name != "thr"
    uniforms = _Uniforms(key, source.num_rows) if randomized else None
    if randomized and source.num_rows is None and not prefix_uniforms(key):
        raise ValueError(
            "a randomised fit over an iterable of chunks draws each row's uniform "
            "as the rows arrive, which equals the in-memory draw only for a "
            "threefry2x32 key with jax_threefry_partitionable=True (got a "
            f"{jax.random.key_impl(key)} key, partitionable="
            f"{jax.config.jax_threefry_partitionable}); pass shard paths instead."
        )
    scores, labels, small, pending = [], [], [], None
    rows = start = k = 0
    for chunk in source:
        if not rows:
            rows, k = chunk.x.shape
            rows = max(rows, -(-MIN_ENTRIES // k))
            if k < 2:
                raise ValueError(
                    f"{chunk.where(0)}: the logits have K = {k} class(es); a "
                    "conformal predictor needs K >= 2 classes."
                )
        x, y, valid = chunks.padded(chunk, rows)
        # The previous chunk's scores, computed while the host produced this
        # chunk, are fetched before the next step: one step's temporaries
        # (the chunk's float32 softmax and sort) at a time, and the host
        # never reads ahead of the device.
        if pending is not None:
            _collect(*pending, scores)
        x = jnp.asarray(x)
        u = uniforms.take(start, rows) if randomized else None
        step = _predictor.scores_core(name, x, jnp.asarray(y), u, lam, k_reg=k_reg)
        pending = (chunk, step, _nonfinite(x, valid))
        if mondrian:
            labels.append(y[: chunk.x.shape[0]])
        start += chunk.x.shape[0]
        if start * k < MIN_ENTRIES:
            small.append((chunk.x, y[: chunk.x.shape[0]]))
    _collect(*pending, scores)
    if start * k < MIN_ENTRIES:
        # A whole input under MIN_ENTRIES entries: scored in one call, as the
        # in-memory fit (whose array is on XLA's other code path too).
        x, y = (np.concatenate(part) for part in zip(*small))
        u = _predictor.uniforms(key, start, jnp.float32) if randomized else None
        scores = [
            _predictor.scores_core(
                name, jnp.asarray(x), jnp.asarray(y), u, lam, k_reg=k_reg
            )
        ]
    scores = jnp.asarray(np.concatenate(scores))
    fitted = {
        "num_classes": k,
        "alpha": alpha,
        "randomized": randomized,
        "lam": lam,
        "k_reg": k_reg,
        "allow_empty": options["allow_empty"],
    }
    _scores.quantile_rank(start, alpha)  # n large enough for alpha
    if not mondrian:
        return _predictor.predictor_of_scores(name, scores, **fitted)
    labels = np.concatenate(labels)
    if options["absent"] == "error":
        _mondrian.check_class_counts(labels, k, alpha)
    return _mondrian.mondrian_of_scores(
        name, scores, jnp.asarray(labels), absent=options["absent"], **fitted
    )
