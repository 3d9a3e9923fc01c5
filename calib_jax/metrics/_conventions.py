r"""Binning conventions (presets of popular libraries: ``docs/metrics.md``)
and equal-width bin assignment.

Edge rules, float32 :math:`E_0 = 0 < E_1 < \dots < E_M = 1`: ``'nearest'``,
the float32 nearest to :math:`k/M`; ``'ceil64'``, the smallest float32 not
below the float64 ``np.linspace(0, 1, M + 1)[k]`` (float32 comparisons then
agree with float64 ones); ``'floor'``, no edges: the bin is
``floor(float32(c * M))`` clipped to ``[0, M - 1]``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

EDGE_RULES = ("nearest", "ceil64", "floor")
EQUAL_MASS_RULES = ("rank", "interp", "quantile", "digitize")
# Above this many bins the edge count switches from M fused comparisons to a
# binary search.
_MAX_COMPARE_BINS = 48


@dataclasses.dataclass(frozen=True)
class Convention:
    """How confidences are binned and how binned errors are combined.

    Attributes:
      name: preset name (free text for a custom convention).
      edge_rule: ``'nearest'``, ``'ceil64'`` or ``'floor'`` (module docstring).
      side: ``'left'`` for bins ``[E_k, E_{k+1})`` or ``'right'`` for
        ``(E_k, E_{k+1}]``.
      top: ``'last'`` puts a confidence of exactly 1.0 in bin ``M - 1``;
        ``'extra'`` gives it a bin ``M`` of its own (``M + 1`` bins in all).
      zero: with ``side='right'``, ``'first'`` puts exactly 0 in bin 0 and
        ``'drop'`` leaves it out of every bin while still counting it in the
        number of samples ``N``. Ignored for ``side='left'``.
      min_count: bins holding fewer samples contribute no error (their samples
        still count in ``N``); 1 means only empty bins are skipped.
      equal_mass: equal-mass rule (``'rank'``, ``'interp'``, ``'quantile'``,
        ``'digitize'``, see ``docs/metrics.md``) or None when the library has none.
      l2_root: for class-averaged l2 errors, ``'after_mean'`` takes the root of
        the class mean of squared errors, ``'per_class'`` averages per-class
        roots.
      library: the library whose rule this reproduces (documentation only).
    """

    name: str
    edge_rule: str = "nearest"
    side: str = "left"
    top: str = "last"
    zero: str = "first"
    min_count: int = 1
    equal_mass: str | None = "rank"
    l2_root: str = "after_mean"
    library: str = ""

    def __post_init__(self):
        checks = (
            ("edge_rule", self.edge_rule, EDGE_RULES),
            ("side", self.side, ("left", "right")),
            ("top", self.top, ("last", "extra")),
            ("zero", self.zero, ("first", "drop")),
            ("equal_mass", self.equal_mass, EQUAL_MASS_RULES + (None,)),
            ("l2_root", self.l2_root, ("after_mean", "per_class")),
        )
        for field, value, allowed in checks:
            if value not in allowed:
                raise ValueError(
                    f"Convention.{field} must be one of {allowed}, got {value!r}."
                )
        if self.edge_rule == "floor" and (self.side, self.top) != ("left", "last"):
            raise ValueError("edge_rule='floor' implies side='left' and top='last'.")
        if self.side == "right" and self.top == "extra":
            raise ValueError("top='extra' needs side='left' ([lo, hi) bins).")
        if int(self.min_count) < 1:
            raise ValueError(f"min_count must be >= 1, got {self.min_count}.")


PRESETS: dict[str, Convention] = {
    "calib_jax": Convention(name="calib_jax", library="calib_jax (default)"),
    "torchmetrics": Convention(
        name="torchmetrics",
        top="extra",
        equal_mass=None,
        library="torchmetrics 1.x (MulticlassCalibrationError)",
    ),
    "netcal": Convention(
        name="netcal",
        edge_rule="ceil64",
        equal_mass="quantile",
        library="netcal 1.x (netcal.metrics.ECE, sample_threshold=1)",
    ),
    "focal_calibration": Convention(
        name="focal_calibration",
        side="right",
        zero="drop",
        equal_mass="interp",
        library="ECELoss/AdaptiveECELoss/ClasswiseECELoss of the focal-loss, "
        "MbLS and ACLS code",
    ),
    "robustness_metrics": Convention(
        name="robustness_metrics",
        edge_rule="floor",
        equal_mass="digitize",
        library="robustness_metrics 'ece' (tf.histogram_fixed_width_bins); "
        "equal-mass: its GeneralCalibrationError (binning_scheme='adaptive', "
        "max_prob=True, norm 'l1' or 'l2')",
    ),
}
DEFAULT = "calib_jax"


def get_convention(convention: str | Convention = DEFAULT) -> Convention:
    """Returns the :class:`Convention` for a preset name (or passes one through).

    Raises:
      ValueError: unknown preset name; the message lists the known ones.
    """
    if isinstance(convention, Convention):
        return convention
    if isinstance(convention, str) and convention in PRESETS:
        return PRESETS[convention]
    raise ValueError(
        f"Unknown binning convention {convention!r}; known presets: "
        f"{', '.join(sorted(PRESETS))} (or pass a calib_jax.metrics.Convention)."
    )


def num_slots(convention: Convention, num_bins: int) -> int:
    """Number of accumulators: ``M``, or ``M + 1`` with ``top='extra'``."""
    return num_bins + (1 if convention.top == "extra" else 0)


def edges(convention: Convention, num_bins: int) -> np.ndarray:
    """The float32 edges ``E_0 .. E_M`` (``[M + 1]``) of a convention."""
    m = int(num_bins)
    if convention.edge_rule == "ceil64":
        e64 = np.linspace(0.0, 1.0, m + 1)
        e32 = e64.astype(np.float32)
        low = e32.astype(np.float64) < e64
        e32[low] = np.nextafter(e32[low], np.float32(np.inf))
        return e32
    # 'nearest' (also used to report the bins of 'floor').
    return (np.arange(m + 1, dtype=np.float64) / m).astype(np.float32)


def slot_edges(convention: Convention, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper edge of every accumulator (``[S]`` each, for plots)."""
    e = edges(convention, num_bins)
    lower, upper = e[:-1], e[1:]
    if convention.top == "extra":
        lower = np.append(lower, np.float32(1.0))
        upper = np.append(upper, np.float32(1.0))
    return lower, upper


def count_edges(conf: jax.Array, table, strict: bool) -> jax.Array:
    """Number of entries of the sorted ``table`` (static length) below (``<``)
    or at (``<=``, ``strict=False``) ``conf``."""
    if len(table) <= _MAX_COMPARE_BINS:
        count = jnp.zeros(conf.shape, jnp.int32)
        for value in table:
            e = jnp.asarray(value, conf.dtype)
            hit = (conf > e) if strict else (conf >= e)
            count = count + hit.astype(jnp.int32)
        return count
    side = "left" if strict else "right"
    return jnp.searchsorted(jnp.asarray(table, conf.dtype), conf, side=side).astype(
        jnp.int32
    )


@functools.lru_cache(maxsize=256)
def _multiply_is_exact(edge_rule: str, side: str, num_bins: int) -> bool:
    """True when ``floor(c*M)`` (left) / ``ceil(c*M) - 1`` (right) in float32
    gives the edge-defined bin for every float32 ``c`` in [0, 1] (false for
    ``M = 22``); ``c * M`` is monotone, so an edge's two neighbours decide."""
    m = num_bins
    e = edges(Convention(name="check", edge_rule=edge_rule), m)
    scale = np.float32(m)
    below = np.nextafter(e, np.float32(-1))
    above = np.nextafter(e, np.float32(2))
    with np.errstate(over="ignore"):
        for k in range(1, m + 1):
            if side == "left":
                if np.floor(e[k] * scale) != k or np.floor(below[k] * scale) != k - 1:
                    return False
            elif k < m and (
                np.ceil(e[k] * scale) - 1 != k - 1 or np.ceil(above[k] * scale) - 1 != k
            ):
                return False
    return True


def bin_index(conf: jax.Array, num_bins: int, convention: Convention) -> jax.Array:
    """Equal-width bin of every confidence ``[...]`` in [0, 1]: int32 in
    ``[-1, S)``, ``S = num_slots(convention, M)``; ``-1`` for no bin (exactly
    0 under ``zero='drop'``)."""
    m = int(num_bins)
    if convention.edge_rule == "floor":
        return jnp.clip(jnp.floor(conf * m).astype(jnp.int32), 0, m - 1)
    if _multiply_is_exact(convention.edge_rule, convention.side, m):
        scaled = conf * m
        if convention.side == "left":
            b = jnp.maximum(jnp.floor(scaled).astype(jnp.int32), 0)
            return jnp.minimum(b, m if convention.top == "extra" else m - 1)
        b = jnp.minimum(jnp.ceil(scaled).astype(jnp.int32) - 1, m - 1)
        return jnp.maximum(b, 0 if convention.zero == "first" else -1)
    e = edges(convention, m)
    if convention.side == "left":
        # [E_k, E_k+1): the number of edges E_1..E_M at or below conf.
        b = count_edges(conf, e[1:], strict=False)
        return b if convention.top == "extra" else jnp.minimum(b, m - 1)
    # (E_k, E_k+1]: the number of edges E_0..E_M-1 strictly below conf, minus 1.
    b = count_edges(conf, e[:-1], strict=True) - 1
    return jnp.maximum(b, 0) if convention.zero == "first" else b


def _unscaled(s: float, m: int, dtype, strict: bool):
    """The threshold on ``c`` of ``c * m >= s`` (``strict``: ``> s``) in
    ``dtype`` arithmetic: rounding is monotone, so one exists."""
    if not np.isfinite(s):
        return s
    m, up, down = dtype.type(m), dtype.type(np.inf), dtype.type(-np.inf)
    c = dtype.type(s) / m
    if strict:  # the largest c with c * m <= s
        while c * m > s:
            c = np.nextafter(c, down)
        while np.nextafter(c, up) * m <= s:
            c = np.nextafter(c, up)
    else:  # the smallest c with c * m >= s
        while c * m < s:
            c = np.nextafter(c, up)
        while np.nextafter(c, down) * m >= s:
            c = np.nextafter(c, down)
    return c


def _slot_thresholds(convention: Convention, m: int, dtype):
    """``(t, strict)`` with ``bin_index(c) >= s`` exactly when ``c > t[s]``
    (``strict``) or ``c >= t[s]``; ``t`` has ``S`` entries, ``-inf`` first
    where every confidence is in a bin, ``+inf`` from the first unreachable
    slot."""
    s = num_slots(convention, m)
    left = convention.side == "left" or convention.edge_rule == "floor"
    scaled = convention.edge_rule == "floor" or _multiply_is_exact(
        convention.edge_rule, convention.side, m
    )
    top = m if convention.top == "extra" and convention.edge_rule != "floor" else m - 1
    e = np.arange(m + 1, dtype=np.float64) if scaled else edges(convention, m)
    t = np.full(s, np.inf)
    t[0] = -np.inf if left or convention.zero == "first" else e[0]
    t[1 : top + 1] = e[1 : top + 1]
    if scaled:
        t = [_unscaled(v, m, dtype, not left) for v in t]
    return np.asarray(t, dtype), not left


def at_least(conf: jax.Array, num_bins: int, convention: Convention) -> jax.Array:
    """bool ``[..., S]``: ``bin_index(conf) >= s``, one float comparison per
    slot against a threshold on ``conf`` (no integer bin, no product, so a
    reduction over the rows fuses with it on an accelerator)."""
    t, strict = _slot_thresholds(convention, int(num_bins), np.dtype(conf.dtype))
    t = jnp.asarray(t).reshape((1,) * conf.ndim + (-1,))
    return conf[..., None] > t if strict else conf[..., None] >= t
