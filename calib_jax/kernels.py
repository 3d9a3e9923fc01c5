r"""Platform switch between the CPU-tuned kernels and their plain formulations.

Several cores of the metrics, losses and post-hoc fits were tuned on XLA:CPU
(packed integer keys, a radix select, complex-packed scatter-adds, fused
``custom_jvp`` row reductions, row-blocked loops). Each such *kernel family*
keeps a plain ``jax.numpy`` formulation of the same function (``jnp.argmax``,
``lax.sort`` on float keys, ``.at[].add``, ``jax.nn.log_softmax`` with JAX's
own autodiff), and this module decides which one is traced:

- ``'tuned'`` on the CPU, always (the measured fast path there);
- off the CPU, the entry of :data:`OFF_CPU`: ``'plain'`` where the tuned
  kernel's *bytes accessed* in the TPU ahead-of-time compile exceed twice the
  plain one's, or where it does not compile for TPU; ``'tuned'`` otherwise.

The decision is made when the computation is lowered, for the platform it is
lowered for (``jax.lax.platform_dependent``): a function jitted on a CPU host
and compiled for a TPU topology gets the TPU choice, and the compiler never
sees a conditional. Families whose off-CPU entry is ``'tuned'`` trace one
formulation only.

Measured table (``benchmarks/tpu_kernels.py``, TPU v5e, one chip; the sizes,
flops and bytes are in ``benchmarks/RESULTS.md``, section "Kernel
portability (TPU ahead-of-time compile)"). ``bytes`` is the tuned kernel's
bytes accessed over the plain one's at the worst measured size:

=======================  ==========================================  ======  =======  ======  =====
family                   tuned kernel                                bytes   TPU      time    GPU
=======================  ==========================================  ======  =======  ======  =====
metric_top_label         ``metrics._common.top_label``, K <= 32      0.24    tuned    1.18    plain
metric_top_label_blocks  ``metrics._common.top_label``, K > 32       16.2    plain    1.42    plain
sort_keys                ``metrics._common.sorted_by_confidence``    1.00    tuned    0.26    tuned
metric_scatter           ``metrics._kernels.accumulate_top_label``   375     plain    0.24    tuned
metric_classwise         ``metrics._kernels.accumulate_classwise``   145     plain    64.4    plain
metric_radix_select      ``metrics._order_statistics.rank_bins``     0.63    tuned    0.66    tuned
loss_rows                ``losses._kernel_base.row_stats``           0.95    tuned    0.31    tuned
loss_true_vs_rest        ``losses._kernel_base.rest_parts``          1.54    tuned    1.04    tuned
loss_dual_focal          ``losses._kernel_base.dual_parts``          0.98    tuned    1.01    tuned
loss_mbls                ``losses._kernel_base.mbls_parts``          0.87    tuned    1.06    tuned
loss_acls                ``losses._kernel_base.acls_parts``          0.88    tuned    0.98    tuned
loss_mdca                ``losses._kernel_base.prob_sums``           1.00    tuned    1.11    tuned
posthoc_temperature      ``posthoc._blocked.exp_sums`` and the JVPs  2.06    plain    4.58    plain
=======================  ==========================================  ======  =======  ======  =====

``TPU`` is what runs on a TPU (and any platform other than the CPU and a
GPU). ``time`` is the tuned kernel's time over the plain one's on one NVIDIA
H100 at the family's largest measured size (``benchmarks/gpu_kernels.py``,
section "Kernel portability on NVIDIA H100 80GB HBM3 (measured)" of
``benchmarks/RESULTS.md``), and ``GPU`` (``'cuda'``, ``'rocm'``) is the plain
formulation where that ratio exceeds 1.15, else the tuned one. The two
columns differ twice: the complex-packed scatter-add of the per-bin sums moves
375x the bytes on a TPU yet runs 2.7-4x faster than ``.at[].add`` on the
H100, and the packed-key top label is 4x lighter on a TPU but 1.18x slower on
the H100.

Override (tests, debugging, a platform the table does not fit):

- the environment variable ``CALIB_JAX_KERNELS`` = ``auto`` (default),
  ``tuned`` or ``plain`` sets every family; it is read when a computation is
  traced, so set it before the first call;
- :func:`use` sets a mode for all or some families inside a ``with`` block;
  its value is part of ``jax.jit``'s cache key, so each mode compiles once
  and switching back reuses the earlier compile.

A forced mode applies on every platform, the CPU included.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax import lax

ENV_VAR = "CALIB_JAX_KERNELS"
MODES = ("auto", "tuned", "plain")

FAMILIES: dict[str, str] = {
    "metric_top_label": "top-label confidence and correctness from one "
    "max-reduction over packed uint32 keys, rows of K <= 32 classes (plain: "
    "jnp.max and jnp.argmax)",
    "metric_top_label_blocks": "the same for K > 32, rows viewed as [N * K / g, "
    "g] blocks of a divisor g of K (plain: jnp.max and jnp.argmax)",
    "sort_keys": "sorts of (confidence, flag) pairs and of scores as packed "
    "int32 keys (plain: lax.sort on float keys with a payload)",
    "metric_scatter": "top-label per-bin sums by one complex-packed scatter-add "
    "in row blocks and lanes (plain: .at[bin].add per statistic)",
    "metric_classwise": "class-wise per-bin sums in a lax.scan over row blocks, "
    "bin 0 derived from column totals (plain: one scatter-add over [N, K])",
    "metric_radix_select": "equal-mass 'rank' bins from a radix select of M - 1 "
    "order statistics (plain: sort and cut)",
    "loss_rows": "softmax row statistics of the batch-level losses with a "
    "custom JVP (plain: log_softmax and JAX autodiff)",
    "loss_true_vs_rest": "true-class-versus-rest log-odds of focal and Brier "
    "with a custom JVP (plain: masked logsumexp and autodiff)",
    "loss_dual_focal": "dual focal's largest non-true logit and rest sum with a "
    "custom JVP (plain: masked argmax, logsumexp and autodiff)",
    "loss_mbls": "MbLS hinge sum with a custom JVP (plain: relu sum, autodiff)",
    "loss_acls": "ACLS hinge sums with a custom JVP (plain: relu sums, autodiff)",
    "loss_mdca": "MDCA's weighted softmax column sums with a custom JVP "
    "(plain: softmax and autodiff)",
    "posthoc_temperature": "row-blocked exp sums of temperature scaling and "
    "their fused derivatives in log T (plain: one pass and autodiff)",
}

# What 'auto' runs off the CPU and off a GPU (TPU measurements). See the
# module docstring and benchmarks/RESULTS.md.
OFF_CPU: dict[str, str] = {
    "metric_top_label": "tuned",
    "metric_top_label_blocks": "plain",
    "sort_keys": "tuned",
    "metric_scatter": "plain",
    "metric_classwise": "plain",
    "metric_radix_select": "tuned",
    "loss_rows": "tuned",
    "loss_true_vs_rest": "tuned",
    "loss_dual_focal": "tuned",
    "loss_mbls": "tuned",
    "loss_acls": "tuned",
    "loss_mdca": "tuned",
    "posthoc_temperature": "plain",
}

# What 'auto' runs on a GPU ('cuda', 'rocm'): H100 timings of both forms.
GPU: dict[str, str] = {
    "metric_top_label": "plain",
    "metric_top_label_blocks": "plain",
    "sort_keys": "tuned",
    "metric_scatter": "tuned",
    "metric_classwise": "plain",
    "metric_radix_select": "tuned",
    "loss_rows": "tuned",
    "loss_true_vs_rest": "tuned",
    "loss_dual_focal": "tuned",
    "loss_mbls": "tuned",
    "loss_acls": "tuned",
    "loss_mdca": "tuned",
    "posthoc_temperature": "plain",
}
GPU_PLATFORMS = ("cuda", "rocm")

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
      >>> with kernels.use("plain", "metric_top_label"):
      ...     print(kernels.mode("metric_top_label"), kernels.mode("loss_rows"))
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
      The forced mode if one is in force, else ``'tuned'`` on ``'cpu'``,
      ``GPU[family]`` on ``'cuda'`` and ``'rocm'``, and ``OFF_CPU[family]``
      elsewhere.
    """
    m = mode(family)
    if m != "auto":
        return m
    if platform == "cpu":
        return "tuned"
    return GPU[family] if platform in GPU_PLATFORMS else OFF_CPU[family]


def select(family: str, tuned: Callable, plain: Callable, *args):
    """Calls the formulation of a family that runs where the code is lowered.

    ``tuned`` and ``plain`` must return the same pytree of shapes and dtypes.
    Under ``'auto'`` with a ``'plain'`` entry for the TPU or the GPU both are
    traced and ``jax.lax.platform_dependent`` keeps one per lowering
    platform; otherwise only the chosen one is traced.
    """
    m = mode(family)
    if m == "auto":
        if OFF_CPU[family] == GPU[family] == "tuned":
            return tuned(*args)
        if jax.config.jax_enable_x64:
            tuned = _with_dtypes_of(plain, tuned, args)
        forms = {"tuned": tuned, "plain": plain}
        on_gpu = dict.fromkeys(GPU_PLATFORMS, forms[GPU[family]])
        return lax.platform_dependent(
            *args, cpu=tuned, **on_gpu, default=forms[OFF_CPU[family]]
        )
    return tuned(*args) if m == "tuned" else plain(*args)


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
