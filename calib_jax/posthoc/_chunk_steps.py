r"""Per-chunk steps of :func:`calib_jax.posthoc.fit_of_chunks`: each adds a
chunk's share of a TS objective (NLL; SB-ECE, Eqs. (8)-(12) of Karandikar et
al. 2021) and of its derivative in :math:`u = \log T` (:func:`jax.jvp`) to
sums carried on the device; padding rows (``valid`` False) count nowhere."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from calib_jax import losses
from calib_jax.losses._base import safe_pow
from calib_jax.posthoc import _core, _temperature, _validate


@jax.jit
def chunk_checks(x, labels, valid):
    """``(NaN/inf rows, first such row, correct rows, simplex)`` of a chunk."""
    z = _core.upcast(x)
    bad = valid & ~jnp.all(jnp.isfinite(z), axis=1)
    correct = valid & (jnp.argmax(z, axis=1) == labels)
    return (
        jnp.sum(bad.astype(jnp.int32)),
        jnp.argmax(bad),
        jnp.sum(correct.astype(jnp.int32)),
        _validate.simplex_rows(z, valid),
    )


def _row_constants(x, labels, valid):
    """Zeroed padding, row maxima and ``m - z_y`` of a chunk (as ``canonical``)."""
    z = jnp.where(valid[:, None], _core.upcast(x), 0.0)
    labels = jnp.where(valid, labels, 0)
    m = jnp.max(z, axis=1)
    return z, labels, m, m - _core.pick(z, labels)


@jax.jit
def nll_step(carry, u, x, labels, valid):
    """``carry + (sum, d sum / du)`` of the chunk's NLL rows at ``u = log T``."""
    z, labels, m, a = _row_constants(x, labels, valid)
    w = valid.astype(z.dtype)
    value, slope = jax.jvp(
        lambda v: _temperature.nll_of_log_t(v, z, m, a, w), (u,), (jnp.ones_like(u),)
    )
    return carry[0] + value, carry[1] + slope


def empty_bins(num_bins, dtype=jnp.float32):
    """Per-bin soft sums of no rows: mass ``s``, ``r = sum u(1 - a)``, ``g =
    sum u(a - c)``, mean confidence ``mu``, ``m2 = sum u(c - mu)^2``."""
    zeros = jnp.zeros((num_bins,), dtype)
    return {"s": zeros, "r": zeros, "g": zeros, "mu": zeros, "m2": zeros}


def _safe_ratio(num, den):
    """``num / den`` where ``den > 0``, else 0 (finite derivatives either way)."""
    pos = den > 0
    return jnp.where(pos, num / jnp.where(pos, den, 1.0), 0.0)


def _merge_bins(a, b):
    """Per-bin sums of two sets of rows (Chan, Golub and LeVeque 1979)."""
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
    """Confidences of ``z / e^u``, correctness and soft memberships of a chunk."""
    z, labels, m, _ = _row_constants(x, labels, valid)
    correct = (jnp.argmax(z, axis=1) == labels).astype(z.dtype)
    conf = _temperature.top_confidence_of_log_t(u, z, m)
    member = losses.soft_bin_membership(conf, num_bins, sb_temperature)
    return conf, correct, jnp.where(valid[:, None], member, 0.0)


def _chunk_bins(u, x, labels, valid, num_bins, sb_temperature):
    """The per-bin soft sums (:func:`empty_bins`) of one chunk."""
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
def bins_step(carry, u, x, labels, valid, sb_temperature, *, num_bins):
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
def lb_step(carry, u, acc, dacc, x, labels, valid, sb_temperature, p, *, num_bins):
    """``carry + (sum, d sum / du)`` of the chunk's Eq. (12) terms
    :math:`\\sum_{ij} u_{ij} |A_j - c_i|^p` at bin accuracies ``acc``, ``dacc``."""

    def total(v, bin_acc):
        conf, _, member = _chunk_confidences(
            v, x, labels, valid, num_bins, sb_temperature
        )
        dev = safe_pow(jnp.abs(bin_acc[None, :] - conf[:, None]), p)
        return jnp.sum(member * dev, axis=0)

    value, slope = jax.jvp(total, (u, acc), (jnp.ones_like(u), dacc))
    return carry[0] + value, carry[1] + slope


def _sb_value(bins, count, p, kind):
    """SB-ECE (Eqs. (11)-(12); p = 2 for ``'lb'``) from every row's bin sums."""
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
def sb_finish(bins, dbins, count, p, *, kind):
    """``(value, d value / du)`` of SB-ECE from the merged bins and their tangent."""
    return jax.jvp(lambda b: _sb_value(b, count, p, kind), (bins,), (dbins,))


@jax.jit
def accuracy_of_bins(bins, dbins):
    """``(A, dA/du, occupied)`` of the merged bins (the first ``'lb'`` pass)."""
    acc, dacc = jax.jvp(_bin_accuracy, (bins["s"], bins["r"]), (dbins["s"], dbins["r"]))
    return acc, dacc, _occupied(bins["s"])


@jax.jit
def lb_finish(total, dtotal, occupied, count, p):
    """``(value, d value / du)`` of Eq. (12) from the per-bin totals."""

    def value(t):
        return safe_pow(jnp.sum(jnp.where(occupied, t, 0.0)) / count, 1.0 / p)

    return jax.jvp(value, (total,), (dtotal,))
