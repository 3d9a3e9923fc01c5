"""Training objectives as configs write them: named objectives and loss fields.

An objective is a sequence of loss terms for :func:`calib_jax.losses.composite`
(``{name, weight=1, **hyperparameters}``), summed in that order. A config
holds it in ``config.loss`` (and ``config.interleaved.secondary``) in one of
two forms:

- the **field form**, which the shipped configs write (:func:`loss_config`):
  ``terms``, the term keys in summation order, and one field per term key
  holding its ``weight`` and every hyperparameter of the loss, defaults taken
  from the loss function's signature. Each is a config field, so it can be
  overridden on the command line, a misspelt name getting the same "Did you
  mean" suggestion as any other field::

    --config.loss.sb_ece.temperature=0.005 --config.loss.cross_entropy.weight=0.5

  A term's key is its loss name, or ``<name>_<n>`` for the ``n``-th term of
  the same loss (``n >= 2``): the key of its logs, ``loss/<key>``.
- the **tuple form**, a sequence of term dicts, which replaces the objective
  whole (its hyperparameters not given take the loss's defaults)::

    --config.loss="({'name': 'cross_entropy'}, {'name': 'mdca', 'weight': 2.0})"

:func:`loss_terms` turns either form into the term sequence. Importing this
module imports neither JAX nor any other heavy library: configs import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ml_collections import ConfigDict, FieldReference

# name -> loss terms of the training methods that the configs
# (``configs/common.py``) and the benchmark grid (:mod:`calib_jax.benchmark.grid`)
# offer; hyperparameters not given take the papers' defaults of the loss
# functions.
OBJECTIVES: dict[str, tuple[dict, ...]] = {
    "ce": (dict(name="cross_entropy"),),
    "focal": (dict(name="focal", gamma=3.0),),
    "flsd53": (dict(name="focal_adaptive"),),
    "inverse_focal": (dict(name="inverse_focal"),),
    "dual_focal": (dict(name="dual_focal"),),
    "ls": (dict(name="label_smoothing", epsilon=0.1),),
    "mbls": (dict(name="cross_entropy"), dict(name="mbls")),
    "acls": (dict(name="cross_entropy"), dict(name="acls")),
    # ACLS as cvlab-yonsei/ACLS computes it (calibrate/losses/acls.py), with its
    # default weights (pos_lambda 1, neg_lambda 0.1, alpha 0.1) and margin 10.
    "acls_released": (
        dict(name="cross_entropy"),
        dict(name="acls", variant="released_code"),
    ),
    "cpc": (dict(name="cross_entropy"), dict(name="cpc")),
    "mdca": (dict(name="cross_entropy"), dict(name="mdca")),
    "mmce": (dict(name="cross_entropy"), dict(name="mmce")),
    "avuc": (dict(name="cross_entropy"), dict(name="avuc")),
    "avuc_gs": (dict(name="cross_entropy"), dict(name="avuc_gs")),
    "s_avuc": (dict(name="cross_entropy"), dict(name="s_avuc")),
    "sb_ece": (dict(name="cross_entropy"), dict(name="sb_ece")),
    "aurc": (dict(name="aurc"),),
    "au_pxtau": (dict(name="au_pxtau"),),
    # AU_Pxτ without the weight-gradient term of Eq. (27) (constant weights).
    "au_pxtau_stopgrad": (dict(name="au_pxtau", weight_grad=False),),
    # AU_Pxτ as han678/CalibWeightedRisk computes it (loss/selectAU.py): the
    # score on softmax(softmax(z)), 64 bins, hist_sigma 0.05, batch-quantile τ.
    "au_pxtau_released": (
        dict(name="au_pxtau", variant="released_code", num_bins=64, nu=0.05),
    ),
}

# The field of the field form that orders the terms.
TERMS = "terms"


def term_name(key: str) -> str:
    """The loss name of term ``key``: ``key`` without a ``_<n>`` suffix, ``n >= 2``."""
    base, sep, n = key.rpartition("_")
    if sep and base and n.isdigit() and int(n) >= 2:
        return base
    return key


def term_keys(names: Sequence[str]) -> list[str]:
    """The key of each term of ``names``: the name, ``<name>_<n>`` for a repeat.

    The same keys :func:`calib_jax.losses.composite` logs the terms under.
    """
    seen: dict[str, int] = {}
    keys = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return keys


def _defaults(name: str) -> dict[str, object]:
    """``{hyperparameter: default}`` of loss ``name`` ({} for an unknown name)."""
    # Deliberately lazy: the losses import JAX, and configs import this module.
    import inspect  # noqa: PLC0415

    from calib_jax import losses  # noqa: PLC0415

    fn = losses.LOSSES.get(name)
    if fn is None:
        return {}  # the trainer's validation names the unknown loss
    return {
        key: p.default
        for key, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and key != "where"
    }


def _is_mapping(x) -> bool:
    return isinstance(x, (Mapping, ConfigDict))  # a ConfigDict is no Mapping


def _field(value, default) -> object:
    # A field that may be None takes any literal on the command line
    # (``--config.loss.au_pxtau.coverage=0.9``); the others keep their type.
    if value is None or default is None:
        return FieldReference(value, field_type=object)
    return value


def loss_config(
    terms: Sequence[Mapping[str, object]], what: str = "loss"
) -> ConfigDict:
    """The field form of the loss terms ``terms`` (``[{name, weight=1, **hp}]``).

    Every hyperparameter of each term's loss becomes a field, the value given
    in ``terms`` or else the default of the loss function's signature, so that
    the set of fields is complete (ml_collections suggests the closest name
    for a misspelt one). Values are kept as given (an int stays an int): the
    objective built from the field form is the one built from ``terms``.
    Names and hyperparameters are not checked here; the trainer's validation
    (:func:`calib_jax.train.validate`) checks them, naming the field.

    Args:
      terms: the tuple form, e.g. ``(dict(name='cross_entropy'), dict(name='sb_ece'))``.
      what: the field's path under ``config.``, for error messages.

    Returns:
      ``ConfigDict(terms=(<key>, ...), <key>=ConfigDict(weight=..., **hp), ...)``.

    Raises:
      ValueError: ``terms`` is not a non-empty sequence of dicts with a ``name``.
    """
    if _is_mapping(terms) or isinstance(terms, str) or not terms:
        raise ValueError(
            f"config.{what} terms must be a non-empty list of dicts like "
            "[{'name': 'cross_entropy', 'weight': 1.0}, ...]."
        )
    for i, term in enumerate(terms):
        if not _is_mapping(term) or not isinstance(term.get("name"), str):
            raise ValueError(
                f"config.{what} term #{i} must be a dict with a 'name' key, "
                f"got {term!r}."
            )
    keys = term_keys([term["name"] for term in terms])
    out = ConfigDict()
    out[TERMS] = tuple(keys)
    for key, term in zip(keys, terms, strict=True):
        given = {k: v for k, v in term.items() if k != "name"}
        weight = given.pop("weight", 1.0)
        if isinstance(weight, int) and not isinstance(weight, bool):
            weight = float(weight)  # the objective takes float(weight) anyway
        defaults = _defaults(term["name"])
        fields = {"weight": weight, **defaults, **given}
        out[key] = ConfigDict(
            {k: _field(v, defaults.get(k, v)) for k, v in fields.items()}
        )
    return out


def loss_field(terms: Sequence[Mapping[str, object]], what: str = "loss"):
    """A config field holding :func:`loss_config` of ``terms`` that takes either form.

    Assign it once where the field is created (``c.loss = loss_field(...)``);
    later assignments of a field form or a tuple form to ``c.loss`` keep it
    (a plain ConfigDict field could not be replaced by a tuple, neither in
    Python nor by ``--config.loss="(...)"``).
    """
    return FieldReference(loss_config(terms, what), field_type=object)


def _string_loss(text: str, what: str) -> ValueError:
    """The error for ``config.<what>`` given as a string.

    A name is not taken as the objective: ``focal`` names both a loss (its
    defaults) and an objective (``gamma=3``), ``mdca`` a loss alone and an
    objective with cross-entropy, so the message shows both spellings.
    """
    if text.lstrip().startswith(("(", "[", "{")):
        return ValueError(
            f"config.{what}: could not parse {text!r} as a tuple of term dicts "
            "(are its brackets and quotes closed?); write e.g. "
            f"--config.{what}=\"({{'name': 'cross_entropy'}}, {{'name': 'mdca', "
            "'weight': 2.0})\"."
        )
    name = text.strip() or "cross_entropy"
    hint = (
        f"; the '{name}' method of the configs is {OBJECTIVES[name]!r}"
        if name in OBJECTIVES
        else ""
    )
    return ValueError(
        f"config.{what} must be a tuple of term dicts, got the string {text!r}; "
        f"write --config.{what}=\"({{'name': '{name}'}},)\" for that loss "
        f"alone{hint}."
    )


def loss_terms(loss, what: str = "loss") -> tuple[dict, ...]:
    """The loss terms of ``config.<what>`` in either form, in summation order.

    Args:
      loss: the field form (:func:`loss_config`, possibly overridden) or the
        tuple form (returned as given; :func:`calib_jax.losses.composite`
        checks it).
      what: the field's path under ``config.``, for error messages.

    Returns:
      ``({'name': ..., 'weight': ..., **hyperparameters}, ...)``.

    Raises:
      ValueError: a field form whose ``terms`` do not match its term fields,
        or a string (a loss or objective name, or a tuple literal that could
        not be parsed); the message gives the syntax.
    """
    if isinstance(loss, str):
        raise _string_loss(loss, what)
    if not _is_mapping(loss) or TERMS not in loss:
        return loss
    keys = loss[TERMS]
    if isinstance(keys, str) or not isinstance(keys, Sequence) or not keys:
        raise ValueError(
            f"config.{what}.{TERMS} must be a non-empty tuple of term keys, "
            f"got {keys!r}."
        )
    fields = sorted(k for k in loss if k != TERMS)
    if len(set(keys)) != len(keys):
        raise ValueError(f"config.{what}.{TERMS} lists a term twice: {tuple(keys)}.")
    missing = [k for k in keys if k not in fields]
    if missing:
        raise ValueError(
            f"config.{what}.{TERMS} names {', '.join(map(repr, missing))}, which "
            f"config.{what} has no field of; its terms: {', '.join(fields)}."
        )
    unused = [k for k in fields if k not in keys]
    if unused:
        raise ValueError(
            f"config.{what}.{', '.join(unused)} is not in config.{what}.{TERMS} "
            f"{tuple(keys)}; add it there or drop the field."
        )
    out = []
    for key in keys:
        term = loss[key]
        if not _is_mapping(term) or "name" in term:
            raise ValueError(
                f"config.{what}.{key} must hold the term's weight and "
                f"hyperparameters (its loss is named by the key), got {term!r}."
            )
        hparams = term.to_dict() if isinstance(term, ConfigDict) else dict(term)
        out.append({"name": term_name(key), **hparams})
    return tuple(out)
