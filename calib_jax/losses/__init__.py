"""Training-time calibration losses: pure, jittable, differentiable.

Every loss has the signature ``name(logits, labels, *, <hparams>, where=None)``:
``logits`` float ``[B, K]`` (upcast to float32), ``labels`` int ``[B]``,
``where`` an optional bool ``[B]`` mask (``False`` rows are excluded).

- **Per-example** losses and regularizers (only their penalty) return float32
  ``[B]``; the caller reduces.
- **Batch-level** losses return a float32 scalar over the unmasked batch, the
  global-batch value under ``jax.jit`` on a batch sharded over a ``"data"`` mesh.
- **Correctness**: the *first* arg-max index of the logits equals the label.
  The papers' equations are the default; ``variant='released_code'`` computes
  the authors' code. Both: ``docs/conventions.md``.

:func:`get_loss` looks a loss up by name and binds validated hyperparameters;
:func:`composite` turns a config list of terms into one objective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from calib_jax.losses._au_pxtau import au_pxtau, au_pxtau_weights
from calib_jax.losses._au_pxtau_hist import au_pxtau_update_hist
from calib_jax.losses._aurc import aurc
from calib_jax.losses._avuc import avuc, avuc_gs, s_avuc, soft_uncertainty
from calib_jax.losses._compose import bind, compose
from calib_jax.losses._confidence import msp, neg_entropy, softmax_margin
from calib_jax.losses._cpc import cpc
from calib_jax.losses._focal import dual_focal, focal, focal_adaptive, inverse_focal
from calib_jax.losses._margin import acls, acls_logit_grad, mbls
from calib_jax.losses._mdca import mdca
from calib_jax.losses._mmce import mmce
from calib_jax.losses._primary import brier, cross_entropy, label_smoothing
from calib_jax.losses._soft_ece import (
    sb_ece,
    sb_ece_from_confidences,
    soft_bin_membership,
)

# name -> function; the names in BATCH_LEVEL return a scalar, the others [B].
LOSSES = {
    "cross_entropy": cross_entropy,
    "focal": focal,
    "focal_adaptive": focal_adaptive,
    "inverse_focal": inverse_focal,
    "dual_focal": dual_focal,
    "label_smoothing": label_smoothing,
    "brier": brier,
    "mbls": mbls,
    "acls": acls,
    "cpc": cpc,
    "sb_ece": sb_ece,
    "avuc": avuc,
    "avuc_gs": avuc_gs,
    "s_avuc": s_avuc,
    "mmce": mmce,
    "mdca": mdca,
    "aurc": aurc,
    "au_pxtau": au_pxtau,
}
REGULARIZERS = frozenset({"mbls", "acls", "cpc"})
BATCH_LEVEL = frozenset(
    {"sb_ece", "avuc", "avuc_gs", "s_avuc", "mmce", "mdca", "aurc", "au_pxtau"}
)
# Confidence score functions (logits [B, K] -> [B]) for aurc / au_pxtau.
CONFIDENCE_SCORES = {
    "msp": msp,
    "neg_entropy": neg_entropy,
    "softmax_margin": softmax_margin,
}


def get_loss(name: str, **hparams):
    """Returns the loss ``name`` with ``hparams`` validated and bound.

    Args:
      name: a key of :data:`LOSSES`.
      **hparams: keyword hyperparameters of that loss.

    Returns:
      ``fn(logits, labels, *, where=None)``.

    Raises:
      ValueError: unknown name (the valid names are listed), unknown
        hyperparameter, or a value outside its domain (``temperature <= 0``,
        ``nu <= 0``, ``num_bins < 1``, ``coverage`` outside ``(0, 1]``, ...).
    """
    if name not in LOSSES:
        raise ValueError(
            f"Unknown loss '{name}'. Valid names: {', '.join(sorted(LOSSES))}."
        )
    return bind(name, LOSSES[name], hparams)


def composite(terms: Sequence[Mapping[str, object]]):
    """Builds one objective from config terms ``[{name, weight=1.0, **hparams}]``.

    Per-example terms are averaged over the unmasked batch; batch-level terms are
    used as they are; the total is ``sum_t weight_t * term_t``.

    Args:
      terms: e.g. ``[{'name': 'cross_entropy'}, {'name': 'sb_ece', 'weight': 0.5}]``.

    Returns:
      ``objective(logits, labels, where=None) -> (total, logs)`` with ``logs``
      holding ``'loss/<name>'`` per term and ``'loss/total'``; pure and jittable.

    Raises:
      ValueError: as :func:`get_loss`, plus a malformed term list.

    Examples:
      >>> import jax.numpy as jnp
      >>> objective = composite([{"name": "cross_entropy"}, {"name": "mdca", "weight": 2.0}])
      >>> total, logs = objective(jnp.array([[2.0, 0.0], [0.0, 1.0]]), jnp.array([0, 1]))
      >>> sorted(logs)
      ['loss/cross_entropy', 'loss/mdca', 'loss/total']
    """
    return compose(terms, registry=LOSSES, batch_level=BATCH_LEVEL)


__all__ = [
    "LOSSES",
    "BATCH_LEVEL",
    "REGULARIZERS",
    "CONFIDENCE_SCORES",
    "get_loss",
    "composite",
    *LOSSES,
    "acls_logit_grad",
    "msp",
    "neg_entropy",
    "softmax_margin",
    "au_pxtau_weights",
    "au_pxtau_update_hist",
    "sb_ece_from_confidences",
    "soft_bin_membership",
    "soft_uncertainty",
]
