"""The papers' claims as a data table, evaluated on synthetic rows."""

from __future__ import annotations

import numpy as np

from calib_jax.benchmark import aggregation, evaluate, paper_claims

SEEDS = (0, 1, 2)


def _rows(methods, calibrators=("none",), shifted=False, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for m in methods:
        for c in calibrators:
            for s in SEEDS:
                for shift in ("clean", "a/1", "a/2") if shifted else ("clean",):
                    rows.append(
                        {
                            "method": m,
                            "calibrator": c,
                            "seed": s,
                            "shift": shift,
                            "severity": 0 if shift == "clean" else int(shift[-1]),
                            "ece": float(rng.uniform()),
                            "ece_l2_em": float(rng.uniform()),
                            "accuracy": float(rng.uniform()),
                        }
                    )
    return rows


def _diff(rows, a, b, metric, shifted=False):
    """Paired mean ± SEM of a - b over seeds, in numpy (float64)."""

    def seed_mean(method, cal, s):
        return np.mean(
            [
                r[metric]
                for r in rows
                if (r["method"], r["calibrator"], r["seed"]) == (method, cal, s)
                and (r["shift"] != "clean") == shifted
            ]
        )

    d = np.array([seed_mean(*a, s) - seed_mean(*b, s) for s in SEEDS])
    return d.mean(), d.std(ddof=1) / np.sqrt(len(d))


def _text(label, d):
    return f"{label} {100 * d[0]:+.2f} ± {100 * d[1]:.2f}"


def _by_paper(entries):
    out = {}
    for e in entries:
        out.setdefault(e["paper"], []).append(e)
    return out


def test_released_method_is_tested_and_followed_by_the_papers_equations():
    rows = _rows(["ce", "ls", "focal", "acls", "acls_released"])
    got = _by_paper(paper_claims.claims(rows))
    (acls,) = got["ACLS (Park et al. 2023)"]
    assert acls["claim"].endswith(" (released code: `acls_released`)")
    want = [
        _diff(rows, ("acls_released", "none"), (b, "none"), "ece")
        for b in ("ls", "focal")
    ]
    acc = ", ".join(
        f"{m} {aggregation.fmt(*aggregation.aggregate(rows, m, 'none', 'accuracy'))}"
        for m in ("acls_released", "ls", "focal")
    )
    assert acls["measured"] == (
        f"{_text('acls_released - ls', want[0])}; "
        f"{_text('acls_released - focal', want[1])} (accuracy {acc})"
    )
    assert acls["detectable"] == (
        f"acls_released - ls {200 * want[0][1]:.2f}; "
        f"acls_released - focal {200 * want[1][1]:.2f}"
    )
    assert acls["metric"] == evaluate.METRICS["ece"]
    assert acls["verdict"] == aggregation.verdict(want)
    (eqs,) = got["ACLS as the paper's Eq. (13) (`acls`)"]
    plain = _diff(rows, ("acls", "none"), ("ls", "none"), "ece")
    assert eqs["measured"].startswith(_text("acls - ls", plain) + "; ")
    assert "accuracy" not in eqs["measured"]
    # The entry follows its released-code claim.
    papers = [e["paper"] for e in paper_claims.claims(rows)]
    i = papers.index("ACLS (Park et al. 2023)")
    assert papers[i + 1] == "ACLS as the paper's Eq. (13) (`acls`)"


def test_without_the_released_method_the_claim_uses_the_papers_method_once():
    rows = _rows(["ce", "focal", "aurc", "au_pxtau"])
    got = _by_paper(paper_claims.claims(rows))
    (au,) = got["Reweighted risk, AU_Pxτ (Zhou et al.)"]
    assert "released" not in au["claim"]
    want = [
        _text(f"au_pxtau - {b}", _diff(rows, ("au_pxtau", "none"), (b, "none"), "ece"))
        for b in ("ce", "focal", "aurc")
    ]
    assert au["measured"].startswith("; ".join(want) + " (accuracy ")
    assert au["measured"].endswith(
        "(accuracy "
        + ", ".join(
            f"{m} {aggregation.fmt(*aggregation.aggregate(rows, m, 'none', 'accuracy'))}"
            for m in ("au_pxtau", "ce")
        )
        + ")"
    )
    assert not any(p.startswith("AU_Pxτ as the paper's") for p in got)
    # Methods the grid lacks: nothing measured.
    (stop,) = got[
        "AU_Pxτ with constant weights (`weight_grad=False`; not the paper's Eq. (27))"
    ]
    assert stop["measured"] == "methods not in this grid"
    assert (stop["detectable"], stop["verdict"]) == ("-", "not measured")


def test_shifted_pairs_appear_only_on_a_grid_with_shift():
    cals = ("none", "ts:nll", "ts:sb_ece")
    for shifted in (False, True):
        rows = _rows(["ce", "two_stage"], cals, shifted=shifted)
        got = _by_paper(paper_claims.claims(rows))
        (mac,) = got["MaC-Cal two-stage masked retraining"]
        clean = _diff(rows, ("two_stage", "none"), ("ce", "none"), "ece")
        want = [_text("clean: two_stage - ce", clean)]
        if shifted:
            d = _diff(rows, ("two_stage", "none"), ("ce", "none"), "ece", True)
            want.append(_text("shifted: two_stage - ce", d))
        assert mac["measured"] == "; ".join(want)
        ts = got["Soft calibration objectives (Karandikar et al. 2021)"][1]
        on = "all" if shifted else "clean"
        d = aggregation.mean_sem(
            np.array(
                list(
                    aggregation.per_seed(
                        rows, "*", "ts:sb_ece", "ece_l2_em", on
                    ).values()
                )
            )
            - np.array(
                list(
                    aggregation.per_seed(rows, "*", "ts:nll", "ece_l2_em", on).values()
                )
            )
        )
        note = (
            aggregation.wins(rows, "ts:sb_ece", "ts:nll", "ece_l2_em", on)
            + "; clean: "
            + aggregation.wins(rows, "ts:sb_ece", "ts:nll", "ece_l2_em", "clean")
        )
        assert ts["measured"] == f"{_text('shifted: TS-SB-ECE - TS', d)} ({note})"


def test_best_soft_objective_against_the_best_other_method():
    rows = _rows(["ce", "focal", "sb_ece", "s_avuc"])
    soft = paper_claims.claims(rows)[0]
    assert soft["claim"].startswith("S-AvUC / SB-ECE")

    def clean(m):
        return aggregation.aggregate(rows, m, "none", "ece_l2_em")[0]

    a = min(("s_avuc", "sb_ece"), key=clean)
    b = min(("ce", "focal"), key=clean)
    d = _diff(rows, (a, "none"), (b, "none"), "ece_l2_em")
    assert soft["measured"] == _text(f"{a} - {b}", d)
    only_soft = paper_claims.claims(_rows(["sb_ece"]))[0]
    assert only_soft["verdict"] == "not measured"


def test_a_new_claim_is_a_new_row_of_the_table():
    rows = _rows(["ce", "focal"], ("none", "ts:nll"))
    table = (
        paper_claims.Claim(
            paper="P",
            claim="focal and TS lower the ECE",
            metric="ece",
            pairs=(
                paper_claims.Pair("focal - ce", ("focal", "none"), ("ce", "none")),
                paper_claims.Pair("ts - none", ("*", "ts:nll"), ("*", "none")),
                paper_claims.Pair(
                    "shifted", ("focal", "none"), ("ce", "none"), paper_claims.SHIFTED
                ),
            ),
        ),
    )
    (entry,) = paper_claims.claims(rows, table)
    d1 = _diff(rows, ("focal", "none"), ("ce", "none"), "ece")
    pooled = [
        np.mean([r["ece"] for r in rows if (r["calibrator"], r["seed"]) == (c, s)])
        for c in ("ts:nll", "none")
        for s in SEEDS
    ]
    diffs = np.array(pooled[:3]) - np.array(pooled[3:])
    d2 = (diffs.mean(), diffs.std(ddof=1) / np.sqrt(3))
    assert entry["measured"] == f"{_text('focal - ce', d1)}; {_text('ts - none', d2)}"
    assert entry["verdict"] == aggregation.verdict([d1, d2])
