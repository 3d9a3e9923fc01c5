"""The papers' headline claims as data, and their test on a grid's rows.

:data:`CLAIMS` holds one :class:`Claim` per headline claim: which
(method, calibrator) pairs it compares, on which metric and shift, and what
the measured text notes. :func:`claims` evaluates every entry on result rows
with the paired differences and verdicts of :mod:`.aggregation`; adding a claim
is adding a row to the table.

Method names in a claim may be ``'{method}'``: the method under test, which is
``Claim.released`` (the authors' released arithmetic) when the grid has it and
``Claim.method`` otherwise. A claim tested with the released method is
followed by the same claim with the paper's equations (``Claim.equations``).
"""

from __future__ import annotations

import dataclasses

from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import evaluate
from calib_jax.benchmark.grid import ensemble_of

# Shifts of a compared pair: the clean test set, the mean over the shifted
# sets (the pair is left out on a grid without shift), or the shifted sets
# when the grid has them and the clean set otherwise.
CLEAN, SHIFTED, SHIFTED_OR_CLEAN = "clean", "shifted", "shifted_or_clean"


@dataclasses.dataclass(frozen=True)
class Pair:
    """One paired difference ``a - b`` of a claim, named ``label``.

    ``a`` and ``b`` are ``(method, calibrator)``; ``'*'`` as the method
    averages over every training method, ``'{method}'`` is the claim's method.
    """

    label: str
    a: tuple[str, str]
    b: tuple[str, str]
    shift: str = CLEAN


@dataclasses.dataclass(frozen=True)
class Claim:
    """One headline claim (every difference claimed negative).

    Attributes:
      paper: the paper (the claims table's first column).
      claim: what it claims.
      metric: the row key compared (a key of
        :data:`calib_jax.benchmark.evaluate.METRICS`).
      pairs: the differences; those whose methods or calibrators the grid
        lacks are left out.
      best_of: instead of ``pairs``, one difference: the best of these
        methods minus the best of the others (lowest clean ``metric`` without
        post-hoc calibration), when the grid has both.
      shift: the shift of :func:`wins_of` (``SHIFTED_OR_CLEAN`` or ``CLEAN``).
      method, released: the method under test, and its released-code variant
        (used instead when the grid has it; ``''``: none).
      equations: ``(paper, claim)`` of the same claim with ``method`` (the
        paper's equations), listed after it when ``released`` was used.
      accuracy_of: methods whose clean accuracy the measured text notes.
      wins_of: ``(calibrator a, calibrator b)``: the measured text notes for
        how many methods ``a`` is lower than ``b`` on ``shift`` and on the
        clean set.
    """

    paper: str
    claim: str
    metric: str
    pairs: tuple[Pair, ...] = ()
    best_of: tuple[str, ...] = ()
    shift: str = CLEAN
    method: str = ""
    released: str = ""
    equations: tuple[str, str] | None = None
    accuracy_of: tuple[str, ...] = ()
    wins_of: tuple[str, str] | None = None


def _against(rivals, **kw) -> tuple[Pair, ...]:
    """``{method} - rival`` without post-hoc calibration, for every rival."""
    return tuple(
        Pair(f"{{method}} - {b}", ("{method}", "none"), (b, "none"), **kw)
        for b in rivals
    )


ACLS_RIVALS = ("ls", "focal", "mbls", "mdca", "cpc")
AU_PXTAU_RIVALS = ("ce", "focal", "aurc")
SOFT = ("s_avuc", "sb_ece", "interleaved_sb_ece")
# The deep ensemble of the ensemble claims (grid.ensemble_name("ce")).
ENSEMBLE = "ensemble(ce)"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        paper="Soft calibration objectives (Karandikar et al. 2021)",
        claim="S-AvUC / SB-ECE (as secondary or interleaved losses) give the lowest "
        "ECE among trained methods",
        metric="ece_l2_em",
        best_of=SOFT,
    ),
    Claim(
        paper="Soft calibration objectives (Karandikar et al. 2021)",
        claim="TS fitted by SB-ECE beats TS fitted by NLL, mostly under shift "
        "(per training method)",
        metric="ece_l2_em",
        pairs=(
            Pair(
                "shifted: TS-SB-ECE - TS",
                ("*", "ts:sb_ece"),
                ("*", "ts:nll"),
                SHIFTED_OR_CLEAN,
            ),
        ),
        shift=SHIFTED_OR_CLEAN,
        wins_of=("ts:sb_ece", "ts:nll"),
    ),
    # The published ACLS numbers come from the authors' code with its lambda
    # values: the claim is tested with acls_released where the grid has it.
    Claim(
        paper="ACLS (Park et al. 2023)",
        claim="ACLS has lower ECE than LS, focal, MbLS, MDCA and CPC",
        metric="ece",
        pairs=_against(ACLS_RIVALS),
        method="acls",
        released="acls_released",
        equations=(
            "ACLS as the paper's Eq. (13) (`acls`)",
            "the same claim with the paper's Eq. (13) and the same lambdas",
        ),
        accuracy_of=("{method}", *ACLS_RIVALS),
    ),
    Claim(
        paper="Class-wise loss scaling (Jung et al.)",
        claim="class-wise loss scaling lowers the ECE of TS, ETS, PTS and CTS",
        metric="ece",
        pairs=tuple(
            Pair(f"{b}+classwise - {b}", ("*", f"{b}+classwise"), ("*", base))
            for b, base in (
                ("ts", "ts:nll"),
                ("ets", "ets"),
                ("pts", "pts"),
                ("cts", "cts"),
            )
        ),
    ),
    Claim(
        paper="MaC-Cal two-stage masked retraining",
        claim="stage II lowers the ECE of its stage-I (cross-entropy) model, also "
        "under corruption",
        metric="ece",
        pairs=(
            Pair("clean: two_stage - ce", ("two_stage", "none"), ("ce", "none")),
            Pair(
                "shifted: two_stage - ce",
                ("two_stage", "none"),
                ("ce", "none"),
                SHIFTED,
            ),
        ),
    ),
    # The published AU_Pxτ numbers come from the authors' code (its score on
    # softmax(softmax(z))): the claim is tested with au_pxtau_released where
    # the grid has it, and the paper's equations get their own row.
    Claim(
        paper="Reweighted risk, AU_Pxτ (Zhou et al.)",
        claim="AU_Pxτ has lower ECE than cross-entropy, focal and AURC",
        metric="ece",
        pairs=_against(AU_PXTAU_RIVALS),
        method="au_pxtau",
        released="au_pxtau_released",
        equations=(
            "AU_Pxτ as the paper's Eqs. (16)-(17) and (27) (`au_pxtau`)",
            "the same claim with the paper's equations",
        ),
        accuracy_of=("{method}", "ce"),
    ),
    Claim(
        paper="AU_Pxτ with constant weights (`weight_grad=False`; not the paper's "
        "Eq. (27))",
        claim="the same claim when the weights carry no gradient",
        metric="ece",
        pairs=_against(AU_PXTAU_RIVALS),
        method="au_pxtau_stopgrad",
    ),
    # Ovadia et al. (2019), Sec. 4.2 and Fig. 2: temperature scaling fitted on
    # clean validation data calibrates well in distribution but degrades under
    # shift, where deep ensembles give the lowest ECE. `ensemble(ce)` averages
    # the probabilities of config.ensemble.size cross-entropy runs.
    Claim(
        paper="Can you trust your model's uncertainty? (Ovadia et al. 2019)",
        claim="a deep ensemble has lower ECE under shift than TS on a single model",
        metric="ece",
        pairs=(
            Pair(
                "shifted: ensemble(ce) - ce+TS",
                (ENSEMBLE, "none"),
                ("ce", "ts:nll"),
                SHIFTED,
            ),
        ),
        accuracy_of=(ENSEMBLE, "ce"),
    ),
    Claim(
        paper="Can you trust your model's uncertainty? (Ovadia et al. 2019)",
        claim="a deep ensemble has lower ECE than a single model, without TS, "
        "clean and under shift",
        metric="ece",
        pairs=(
            Pair("clean: ensemble(ce) - ce", (ENSEMBLE, "none"), ("ce", "none")),
            Pair(
                "shifted: ensemble(ce) - ce",
                (ENSEMBLE, "none"),
                ("ce", "none"),
                SHIFTED,
            ),
        ),
    ),
)


def _shift(spec: str, shifted: bool) -> str | None:
    """The :func:`aggregation.per_seed` shift of ``spec`` (None: not on this grid)."""
    if spec == CLEAN:
        return "clean"
    if spec == SHIFTED:
        return "all" if shifted else None
    return "all" if shifted else "clean"


def _name(method: str, chosen: str) -> str:
    return method.replace("{method}", chosen)


def _pairs(claim: Claim, rows, chosen: str) -> list[tuple[str, tuple, tuple, str]]:
    """``(label, a, b, shift)`` of ``claim`` on ``rows``, before the grid filter."""
    shifted = agg.has_shift(rows)
    if claim.best_of:
        ms = agg.methods(rows)
        soft = [m for m in claim.best_of if m in set(ms)]
        # Trained methods only: an ensemble of runs is not one.
        others = [m for m in ms if m not in claim.best_of and not ensemble_of(m)]
        if not (soft and others):
            return []
        a = agg.best(rows, soft, claim.metric)
        b = agg.best(rows, others, claim.metric)
        return [(f"{a} - {b}", (a, "none"), (b, "none"), "clean")]
    out = []
    for p in claim.pairs:
        on = _shift(p.shift, shifted)
        if on is not None:
            a = (_name(p.a[0], chosen), p.a[1])
            b = (_name(p.b[0], chosen), p.b[1])
            out.append((_name(p.label, chosen), a, b, on))
    return out


def _note(claim: Claim, rows, chosen: str) -> str:
    methods = set(agg.methods(rows))
    if claim.accuracy_of:
        return "accuracy " + ", ".join(
            f"{m} {agg.fmt(*agg.aggregate(rows, m, 'none', 'accuracy'))}"
            for m in (_name(n, chosen) for n in claim.accuracy_of)
            if m in methods
        )
    if claim.wins_of:
        a, b = claim.wins_of
        on = _shift(claim.shift, agg.has_shift(rows))
        return (
            agg.wins(rows, a, b, claim.metric, on)
            + "; clean: "
            + agg.wins(rows, a, b, claim.metric, "clean")
        )
    return ""


def evaluate_claim(
    rows, paper: str, claim: str, metric: str, pairs, note: str = "", num_bins: int = 15
) -> dict:
    """One claims-table entry: paired differences of ``pairs`` and their verdict.

    Args:
      rows: result rows.
      paper, claim, metric: the entry's first three fields.
      pairs: ``(label, a, b, shift)``; a pair whose methods or calibrators
        ``rows`` lack, or whose two sides share no seed, is left out.
      note: appended to the measured text in parentheses (when any pair was
        measured).
      num_bins: the ECEs' bins (``config.num_bins``), named in ``metric``.

    Returns:
      ``{paper, claim, metric, measured, detectable, verdict}``; ``metric``
      as its description (:func:`calib_jax.benchmark.evaluate.describe`).
    """
    known = set(agg.methods(rows)) | {"*"}
    cals = set(agg.calibrators(rows))
    diffs, texts, resolution = [], [], []
    for label, a, b, on in pairs:
        if a[0] in known and b[0] in known and a[1] in cals and b[1] in cals:
            d = agg.paired(rows, a, b, metric, on)
            if d is not None:
                diffs.append(d)
                texts.append(f"{label} {100 * d[0]:+.2f} ± {100 * d[1]:.2f}")
                resolution.append(f"{label} {100 * agg.detectable(d):.2f}")
    measured = "; ".join(texts) if texts else "methods not in this grid"
    return {
        "paper": paper,
        "claim": claim,
        "metric": evaluate.describe(metric, num_bins),
        "measured": measured + (f" ({note})" if note and texts else ""),
        "detectable": "; ".join(resolution) if resolution else "-",
        "verdict": agg.verdict(diffs),
    }


def claims(
    rows, table: tuple[Claim, ...] = CLAIMS, *, num_bins: int = 15
) -> list[dict]:
    """One entry per claim of ``table``, as :func:`evaluate_claim` gives it.

    Differences are paired by seed (method minus baseline, in percentage
    points of the metric); a claim holds when each is negative by more than
    its detectable difference (:func:`.aggregation.verdict`). The report and
    the README print the entries with :func:`.tables.claims_table`.
    """
    methods = set(agg.methods(rows))
    out = []
    for c in table:
        use_released = bool(c.released) and c.released in methods
        chosen = c.released if use_released else c.method
        text = c.claim + (f" (released code: `{c.released}`)" if use_released else "")
        out.append(
            evaluate_claim(
                rows,
                c.paper,
                text,
                c.metric,
                _pairs(c, rows, chosen),
                _note(c, rows, chosen),
                num_bins,
            )
        )
        if use_released and c.equations is not None:
            plain = dataclasses.replace(c, accuracy_of=(), wins_of=None)
            out.append(
                evaluate_claim(
                    rows,
                    *c.equations,
                    c.metric,
                    _pairs(plain, rows, c.method),
                    num_bins=num_bins,
                )
            )
    return out
