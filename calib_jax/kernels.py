r"""Platform switch between the CPU-tuned kernels and their plain formulations.

Every function of the library is written plain first: its paper's equations in
``jax.numpy`` under the plain name. A few were also tuned for XLA:CPU (packed
integer keys, a radix select, fused ``custom_jvp`` reductions, row-blocked
loops) where that was measured to pay at least 1.5x on the CPU
(``benchmarks/cpu_kernels.py``). Each such *kernel family* lives in its
package's ``_cpu_kernels.py`` as a drop-in for the plain function, and the
decorator :func:`dispatch` on the plain function decides which one is traced:

- ``'tuned'`` on the CPU, always (the reason it exists);
- on a GPU (``'cuda'``, ``'rocm'``) the family's ``gpu`` entry, and on a TPU
  and any other platform its ``tpu`` entry, in :data:`FAMILIES`.

The TPU entries come from the TPU ahead-of-time compile
(``benchmarks/tpu_kernels.py``: ``'plain'`` where the tuned kernel's bytes
accessed exceed twice the plain one's, or it does not compile), the GPU
entries from timings of both forms on one H100 (``benchmarks/gpu_kernels.py``:
``'plain'`` where the tuned form is over 1.15x slower). The figures are in
``benchmarks/RESULTS.md``.

The decision is made when the computation is lowered, for the platform it is
lowered for (``jax.lax.platform_dependent``): a function jitted on a CPU host
and compiled for a TPU topology gets the TPU choice, and the compiler never
sees a conditional. A family whose ``tpu`` and ``gpu`` entries are both
``'tuned'`` traces one formulation only.

Override (tests, debugging, a platform the table does not fit):

- the environment variable ``CALIB_JAX_KERNELS`` = ``auto`` (default),
  ``tuned`` or ``plain`` sets every family; it is read when a computation is
  traced, so set it before the first call;
- :func:`use` sets a mode for all or some families inside a ``with`` block;
  its value is part of ``jax.jit``'s cache key, so each mode compiles once
  and switching back reuses the earlier compile.

A forced mode applies on every platform, the CPU included.

A class axis sharded over devices: the plain forms are row reductions the
SPMD partitioner splits per shard. The CPU-tuned metric kernels keep the
class axis apart from the rows whenever the process has more than one
device (``metrics._cpu_kernels.class_ways``: the top label's blocks divide
the classes' even split, the class-wise scatter takes the class as a batch
dimension), so they too reduce ``O(N)`` or ``O(K)`` values across devices and
never gather ``[N, K]`` (``docs/metrics.md``, "Class-axis sharding"). On one
device their results are the single-device bits.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax import lax

ENV_VAR = "CALIB_JAX_KERNELS"
MODES = ("auto", "tuned", "plain")
GPU_PLATFORMS = ("cuda", "rocm")


@dataclasses.dataclass(frozen=True)
class Family:
    """One tuned kernel family: what it does and what runs off the CPU.

    Attributes:
      kernel: the tuned drop-in (``<package>._cpu_kernels.<name>``).
      what: what the tuned form does differently from the plain one.
      tpu: ``'tuned'`` or ``'plain'`` on a TPU and any platform other than
        the CPU and a GPU.
      gpu: ``'tuned'`` or ``'plain'`` on ``'cuda'`` and ``'rocm'``.
    """

    kernel: str
    what: str
    tpu: str
    gpu: str


FAMILIES: dict[str, Family] = {
    "metric_top_label": Family(
        "metrics._cpu_kernels.top_label",
        "top label from one max-reduction over packed uint32 keys (on the CPU,"
        " K > 32 as [N, K / g, g] blocks, K / g a multiple of the devices'"
        " even split of the classes)",
        tpu="tuned",
        gpu="plain",
    ),
    "sort_keys": Family(
        "metrics._cpu_kernels (sorted_by_confidence, ood_ranks, ood_accepted)",
        "sorts of (value, flag) pairs as packed int32 keys",
        tpu="tuned",
        gpu="tuned",
    ),
    "metric_classwise": Family(
        "metrics._cpu_kernels.accumulate_classwise",
        "class-wise per-bin sums in a lax.scan over row blocks (more than one"
        " device: the class a batch dimension of the scatter, one scan per row"
        " range)",
        tpu="plain",
        gpu="plain",
    ),
    "metric_radix_select": Family(
        "metrics._cpu_kernels.rank_stats",
        "equal-mass 'rank' bins from a radix select of the M - 1 order statistics",
        tpu="tuned",
        gpu="tuned",
    ),
    "loss_rows": Family(
        "losses._cpu_kernels.row_parts",
        "softmax row statistics with a fused custom JVP",
        tpu="tuned",
        gpu="tuned",
    ),
    "loss_true_vs_rest": Family(
        "losses._cpu_kernels.rest_parts",
        "true-class-versus-rest log-odds with a custom JVP",
        tpu="tuned",
        gpu="tuned",
    ),
    "loss_dual_focal": Family(
        "losses._cpu_kernels.dual_parts",
        "largest non-true logit and rest sum with a custom JVP",
        tpu="tuned",
        gpu="tuned",
    ),
    "loss_mbls": Family(
        "losses._cpu_kernels.mbls_hinge",
        "MbLS hinge sum with a custom JVP",
        tpu="tuned",
        gpu="tuned",
    ),
    "loss_acls": Family(
        "losses._cpu_kernels.acls_parts",
        "ACLS hinge sums with a custom JVP",
        tpu="tuned",
        gpu="tuned",
    ),
    "posthoc_temperature": Family(
        "posthoc._cpu_kernels (exp_sums, nll_of_log_t, top_confidence_of_log_t)",
        "row-blocked exp sums of temperature scaling and fused derivatives",
        tpu="plain",
        gpu="plain",
    ),
    "posthoc_order_statistics": Family(
        "posthoc._cpu_kernels.grouped_cut",
        "histogram binning's equal-mass cuts by a radix select instead of a sort",
        tpu="plain",
        gpu="plain",
    ),
    "conformal_row_sort": Family(
        "conformal._cpu_kernels.sort_desc",
        "APS/RAPS row sorts by a sorting network of K <= 32 columns",
        tpu="plain",
        gpu="plain",
    ),
}

# The override in force: a sorted tuple of (family or '*', mode) pairs. It is
# a jax.jit cache key, so a change retraces instead of reusing a stale choice.
_OVERRIDE = jax.make_user_context(())


def _check_mode(value: Any, name: str) -> str:
    if value not in MODES:
        raise ValueError(f"{name} must be one of {', '.join(MODES)}; got {value!r}.")
    return value


def _check_family(family: Any) -> str:
    if family not in FAMILIES:
        raise ValueError(
            f"Unknown kernel family {family!r}; known families: {', '.join(FAMILIES)}."
        )
    return family


class use:
    """Forces a kernel mode inside a ``with`` block.

    Args:
      mode: ``'auto'``, ``'tuned'`` or ``'plain'``.
      families: optional family name or names (keys of :data:`FAMILIES`);
        all families when omitted.

    Raises:
      ValueError: an unknown mode or family (the message lists the valid
        ones).

    Examples:
      >>> from calib_jax import kernels
      >>> with kernels.use("plain", "metric_classwise"):
      ...     print(kernels.mode("metric_classwise"), kernels.mode("loss_rows"))
      plain auto
    """

    def __init__(self, mode: str, families: str | Iterable[str] | None = None):
        self._mode = _check_mode(mode, "mode")
        if isinstance(families, str):
            families = (families,)
        self._families = None if families is None else tuple(families)
        for family in self._families or ():
            _check_family(family)
        self._context = None

    def __enter__(self) -> None:
        if self._families is None:
            new = {"*": self._mode}  # replaces everything set so far
        else:
            new = dict(_OVERRIDE.value)
            new.update({f: self._mode for f in self._families})
        self._context = _OVERRIDE(tuple(sorted(new.items())))
        self._context.__enter__()

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)


def mode(family: str) -> str:
    """The mode in force for a family: ``'auto'``, ``'tuned'`` or ``'plain'``.

    A :func:`use` block wins over ``CALIB_JAX_KERNELS``, which wins over the
    default ``'auto'``.

    Raises:
      ValueError: an unknown family, or a bad value of ``CALIB_JAX_KERNELS``.
    """
    _check_family(family)
    override = dict(_OVERRIDE.value)
    if family in override:
        return override[family]
    if "*" in override:
        return override["*"]
    return _check_mode(os.environ.get(ENV_VAR, "auto"), ENV_VAR)


def choice(family: str, platform: str) -> str:
    """The formulation (``'tuned'`` or ``'plain'``) a family runs on a platform.

    Args:
      family: a key of :data:`FAMILIES`.
      platform: a JAX platform name (``'cpu'``, ``'tpu'``, ``'cuda'``,
        ``'rocm'``, ...).

    Returns:
      The forced mode if one is in force, else ``'tuned'`` on ``'cpu'``, the
      family's ``gpu`` entry on ``'cuda'`` and ``'rocm'``, and its ``tpu``
      entry elsewhere.
    """
    m = mode(family)
    if m != "auto":
        return m
    if platform == "cpu":
        return "tuned"
    entry = FAMILIES[family]
    return entry.gpu if platform in GPU_PLATFORMS else entry.tpu


def _select(family: str, tuned: Callable, plain: Callable, *args):
    """Calls the formulation of a family that runs where the code is lowered."""
    m = mode(family)
    if m != "auto":
        return tuned(*args) if m == "tuned" else plain(*args)
    entry = FAMILIES[family]
    if entry.tpu == entry.gpu == "tuned":
        return tuned(*args)
    if jax.config.jax_enable_x64:
        tuned = _with_dtypes_of(plain, tuned, args)
    forms = {"tuned": tuned, "plain": plain}
    on_gpu = dict.fromkeys(GPU_PLATFORMS, forms[entry.gpu])
    return lax.platform_dependent(*args, cpu=tuned, **on_gpu, default=forms[entry.tpu])


def dispatch(family: str, tuned: Callable) -> Callable[[Callable], Callable]:
    """Decorates a plain function with its CPU-tuned drop-in ``tuned``.

    The decorated function calls the formulation :func:`choice` picks for
    the platform it is lowered for. Positional arguments may be arrays;
    keyword arguments must be static (Python values) and are bound to both
    forms. Both forms must return the same pytree of shapes and dtypes. The
    two forms stay reachable as ``.plain`` and ``.tuned``, the family name as
    ``.family``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from calib_jax import kernels
      >>> @kernels.dispatch("loss_acls", lambda x: x + 0.0)
      ... def twice_half(x):
      ...     return 2.0 * (x / 2.0)
      >>> float(twice_half(jnp.float32(3.0)))
      3.0
    """
    _check_family(family)

    def decorate(plain: Callable) -> Callable:
        @functools.wraps(plain)
        def call(*args, **kwargs):
            if kwargs:
                t = functools.partial(tuned, **kwargs)
                p = functools.partial(plain, **kwargs)
                return _select(family, t, p, *args)
            return _select(family, tuned, plain, *args)

        call.plain = plain
        call.tuned = tuned
        call.family = family
        return call

    return decorate


def _with_dtypes_of(plain: Callable, tuned: Callable, args) -> Callable:
    """``tuned`` with its outputs cast to the dtypes ``plain`` returns.

    ``lax.platform_dependent`` needs both forms to return the same types. In
    64-bit mode JAX's promotions can make them differ (a ``jnp.sum`` of
    int32 gives int64, a float64 scalar widens one form's temporaries but
    not the other's fixed-dtype accumulators); the plain form, the
    reference, decides. Only traced shapes are compared (no computation).
    """
    want = jax.eval_shape(plain, *args)
    got = jax.eval_shape(tuned, *args)
    if jax.tree.map(lambda a: a.dtype, want) == jax.tree.map(lambda a: a.dtype, got):
        return tuned

    def cast(*a):
        return jax.tree.map(lambda x, w: x.astype(w.dtype), tuned(*a), want)

    return cast
