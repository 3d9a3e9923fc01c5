"""Deep ensembles, MC dropout, OOD scores and calibration tests in the benchmark.

References are float64 NumPy (the ensemble's mean probabilities, mutual
information, Mann-Whitney AUROC) or the library's own metric functions called
directly on the same calibrated logits (the rows must hold what they return).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from calib_jax import metrics, storage
from calib_jax.benchmark import aggregation as agg
from calib_jax.benchmark import evaluate, grid, paper_claims, tables
from calib_jax.train import evaluate as train_eval
from configs import benchmark_digits


def _logits(seed, n=96, k=4, scale=2.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n).astype(np.int32)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += rng.uniform(0, 3, n)
    return (scale * z).astype(np.float32), y


def _softmax64(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _entropy64(p):
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)


def _write_run(directory, seed, ood="patches"):
    """A finished run's exported logits: val, test, one shifted set, OOD."""
    out = {}
    d = directory / "logits"
    (d / "ood").mkdir(parents=True)
    for i, name in enumerate(("val", "test", "shift_noise_2")):
        z, y = _logits(100 * i + 7)  # same labels for every member
        z = z + np.random.default_rng(seed * 10 + i).normal(size=z.shape).astype(
            np.float32
        )
        storage.save_npz(d / f"{name}.npz", logits=z, labels=y)
        out[name] = (z, y)
    z = np.random.default_rng(seed + 50).normal(size=(40, 4)).astype(np.float32)
    y = np.zeros(40, np.int32)
    storage.save_npz(d / "ood" / f"{ood}.npz", logits=z, labels=y)
    out["ood"] = (z, y)
    return out


def test_ensemble_logits_are_the_log_of_the_float64_mean_probabilities(tmp_path):
    runs = [_write_run(tmp_path / f"m{s}", s) for s in range(3)]
    logits, mi = evaluate.ensemble_logits(
        [tmp_path / f"m{s}" for s in range(3)], "patches"
    )
    assert set(logits) == {"val", "test", "noise/2", "ood"}
    for split, file in (("val", "val"), ("test", "test"), ("noise/2", "shift_noise_2")):
        mean = np.mean([_softmax64(r[file][0]) for r in runs], axis=0)
        z, y = logits[split]
        assert z.dtype == np.float32
        np.testing.assert_array_equal(y, runs[0][file][1])
        np.testing.assert_allclose(np.exp(np.float64(z)), mean, rtol=2e-6, atol=1e-7)
    # Mutual information of the members, for the OOD scores of test and OOD.
    assert set(mi) == {"test", "ood"}
    for split, file in (("test", "test"), ("ood", "ood")):
        p = np.stack([_softmax64(r[file][0]) for r in runs])
        want = _entropy64(p.mean(0)) - _entropy64(p).mean(0)
        np.testing.assert_allclose(mi[split], want, rtol=1e-4, atol=1e-6)
    # A one-member ensemble is the run itself (up to float32 log-softmax).
    one, _ = evaluate.ensemble_logits([tmp_path / "m0"])
    z = runs[0]["test"][0]
    np.testing.assert_allclose(
        one["test"][0], np.log(_softmax64(z)).astype(np.float32), rtol=1e-6, atol=1e-6
    )


def test_ensemble_members_of_other_data_are_refused(tmp_path):
    _write_run(tmp_path / "a", 0)
    _write_run(tmp_path / "b", 1)
    z, y = _logits(7)
    storage.save_npz(tmp_path / "b" / "logits" / "val.npz", logits=z, labels=y[::-1])
    with pytest.raises(ValueError, match="labels of split 'val' differ"):
        evaluate.ensemble_logits([tmp_path / "a", tmp_path / "b"])
    (tmp_path / "b" / "logits" / "shift_noise_2.npz").unlink()
    with pytest.raises(ValueError, match="no exported logits of split 'noise/2'"):
        evaluate.ensemble_logits([tmp_path / "a", tmp_path / "b"])


def _grid(**kw):
    c = benchmark_digits.get_config()
    c.methods = ("ce", "ensemble(ce)", "focal")
    c.seeds = (0, 1, 2)
    c.ensemble.size, c.ensemble.num_groups = 2, 3
    for k, v in kw.items():
        c.ensemble[k] = v
    return c


def test_ensembles_are_disjoint_and_pair_with_the_seeds():
    c = _grid()
    grid.check_grid(c)
    members = [grid.member_seeds(c, g) for g in grid.ensemble_groups(c)]
    assert members == [[0, 1], [2, 3], [4, 5]]
    flat = [s for m in members for s in m]
    assert len(set(flat)) == len(flat)
    cells = grid.cells(c)
    # The ensemble's cells follow its member method's; its seeds are the groups.
    assert cells[:3] == [("ce", 0), ("ce", 1), ("ce", 2)]
    assert cells[3:6] == [("ensemble(ce)", g) for g in (0, 1, 2)]
    # The method's own cells stay those of config.seeds (no rows of seeds 3-5).
    assert [s for m, s in cells if m == "ce"] == [0, 1, 2]
    # An ensemble listed before its method still comes after it.
    c.methods = ("ensemble(ce)", "focal", "ce")
    assert grid.cells(c)[-3:] == [("ensemble(ce)", g) for g in (0, 1, 2)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"methods": ("focal", "ensemble(ce)")}, r"'ce' is not a method of the grid"),
        ({"methods": ("ce", "ensemble(bogus)")}, r"'bogus' is not a method"),
        ({"size": 1}, r"config.ensemble.size must be an integer >= 2, got 1"),
        ({"num_groups": 0}, r"config.ensemble.num_groups must be an integer >= 1"),
        ({"size": True}, r"config.ensemble.size must be an integer >= 2, got True"),
        (
            {"extra_runs": False},
            r"need the runs of seeds 0..5, but config.seeds is \[0, 1, 2\]",
        ),
    ],
)
def test_bad_ensemble_configs_are_one_line_errors(change, message):
    methods = change.pop("methods", None)
    c = _grid(**change)
    if methods is not None:
        c.methods = methods
    with pytest.raises(ValueError, match=message) as e:
        grid.check_grid(c)
    assert "\n" not in str(e.value)


def test_ensemble_from_finished_seeds_only():
    c = _grid(extra_runs=False, num_groups=1)
    grid.check_grid(c)  # seeds 0, 1 of config.seeds: no training


def test_mc_dropout_cell_config():
    c = benchmark_digits.get_config()
    t = grid.train_config(c, "mc_dropout", 1, "/tmp/unused")
    ce = grid.train_config(c, "ce", 1, "/tmp/unused")
    assert t.loss == ce.loss
    assert t.model.dropout_rate == c.mc_dropout.dropout_rate > 0
    assert ce.model.dropout_rate == 0
    assert t.mc_dropout.num_samples == c.mc_dropout.num_samples > 0
    assert ce.mc_dropout.num_samples == 0


def _auroc64(s_in, s_out):
    """Mann-Whitney AUROC in float64 (ties count one half)."""
    s_in, s_out = np.float64(s_in)[:, None], np.float64(s_out)[None, :]
    return float(np.mean((s_in > s_out) + 0.5 * (s_in == s_out)))


@pytest.mark.long
def test_ood_fields_of_every_score():
    (z_in, _), (z_out, _) = _logits(1), _logits(2, n=50, scale=0.5)
    mi_in = np.random.default_rng(0).uniform(0, 0.2, len(z_in)).astype(np.float32)
    mi_out = np.random.default_rng(1).uniform(0.1, 0.5, 50).astype(np.float32)
    out = evaluate.ood_fields(z_in, z_out, test_mi=mi_in, ood_mi=mi_out)
    # Classes of probability 0 (histogram binning, isotonic): log 0 = -inf.
    z_in[:5, 1] = z_out[:5, 2] = -np.inf
    inf = evaluate.ood_fields(z_in, z_out, test_mi=mi_in, ood_mi=mi_out)
    assert all(np.isfinite(v) for v in inf.values())
    z_in[:5, 1] = z_out[:5, 2] = -50.0
    for k, v in evaluate.ood_fields(z_in, z_out).items():
        np.testing.assert_allclose(inf[k], v, atol=1e-6, err_msg=k)
    z_in, z_out = _logits(1)[0], _logits(2, n=50, scale=0.5)[0]
    # The MSP fields are the trainer's, unchanged.
    msp = train_eval.ood_metrics(z_in, z_out)
    assert {k: out[f"ood_{k}"] for k in msp} == msp
    refs = {
        "max_logit": lambda z: z.max(-1),
        "energy": lambda z: np.log(np.exp(np.float64(z)).sum(-1)),
        "entropy": lambda z: -_entropy64(_softmax64(z)),
    }
    for name, f in refs.items():
        np.testing.assert_allclose(
            out[evaluate.ood_field(name, "auroc")],
            _auroc64(f(z_in), f(z_out)),
            atol=1e-6,
        )
    np.testing.assert_allclose(
        out["ood_mutual_information_auroc"], _auroc64(-mi_in, -mi_out), atol=1e-6
    )
    for score in evaluate.OOD_SCORES:
        for m in ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr"):
            assert 0.0 <= out[evaluate.ood_field(score, m)] <= 1.0
    assert "ood_mutual_information_auroc" not in evaluate.ood_fields(z_in, z_out)


@pytest.mark.long
def test_cell_rows_carry_tests_decompositions_and_ood_scores():
    logits = {
        "val": _logits(0, n=160),
        "test": _logits(1, n=160),
        "noise/2": _logits(2, n=160, scale=0.7),
        "ood": _logits(3, n=60, scale=0.3),
    }
    mi = {"test": np.full(160, 0.1, np.float32), "ood": np.full(60, 0.3, np.float32)}
    rows, _ = evaluate.cell_results(
        logits,
        method="ensemble(ce)",
        seed=1,
        calibrators=("none", "ts:nll", "isotonic"),
        test_samples=50,
        mutual_information=mi,
    )
    from calib_jax import posthoc

    fitted = {c: posthoc.fit(c, *logits["val"]) for c in ("ts:nll", "isotonic")}
    key = evaluate.consistency_key("ensemble(ce)", 1)
    assert len(rows) == 6
    for row in rows:
        z, y = logits["test" if row["shift"] == "clean" else row["shift"]]
        if row["calibrator"] != "none":
            z = np.asarray(fitted[row["calibrator"]].apply(z))
        probs = jax.nn.softmax(z, axis=-1)
        test = metrics.spiegelhalter_test(probs, y)
        np.testing.assert_allclose(row["spiegelhalter_z"], test.statistic, rtol=1e-5)
        np.testing.assert_allclose(row["spiegelhalter_p"], test.p_value, atol=1e-6)
        if row["shift"] != "clean":
            assert "ece_consistency_p" not in row and "ood_auroc" not in row
            continue
        c = metrics.ece_consistency_test(probs, y, key=key, num_samples=50)
        np.testing.assert_allclose(c.statistic, row["ece"], rtol=1e-6)
        np.testing.assert_allclose(row["ece_consistency_p"], c.p_value, atol=1e-7)
        for score in evaluate.CORP_SCORES:
            d = metrics.corp_decomposition(probs, y, score=score)
            np.testing.assert_allclose(
                [row[f"corp_{score}_{p}"] for p in evaluate.CORP_PARTS],
                [d.score, d.miscalibration, d.discrimination, d.uncertainty],
                rtol=1e-6,
            )
            np.testing.assert_allclose(
                row[f"corp_{score}_score"],
                row[f"corp_{score}_mcb"]
                - row[f"corp_{score}_dsc"]
                + row[f"corp_{score}_unc"],
                rtol=1e-5,
            )
        # MI is scored from the members, before the calibrator: 0.1 vs 0.3.
        assert row["ood_mutual_information_auroc"] == 1.0
    clean = [r for r in rows if r["shift"] == "clean"]
    assert clean[0]["ood_energy_auroc"] != clean[1]["ood_energy_auroc"]


def _rows():
    """Synthetic rows of two methods, two calibrators, 3 seeds, one shift."""
    rng = np.random.default_rng(3)
    rows = []
    for method in ("ce", "ensemble(ce)"):
        for cal in ("none", "ts:nll"):
            for seed in range(3):
                for shift in ("clean", "noise/1", "noise/3"):
                    r = {"method": method, "calibrator": cal, "seed": seed}
                    r |= {"shift": shift, "severity": 0 if shift == "clean" else 1}
                    r |= {"corruption": shift.split("/")[0], "accuracy": 0.9}
                    base = 0.02 if shift == "clean" else 0.10
                    r["ece"] = base * (0.5 if method != "ce" else 1.0) + 0.001 * seed
                    if cal == "ts:nll" and method == "ce":
                        r["ece"] -= 0.01 if shift == "clean" else 0.02
                    for k in evaluate.METRICS:
                        r.setdefault(k, float(rng.uniform()))
                    r["spiegelhalter_p"] = float(rng.uniform())
                    if shift == "clean":
                        r["ece_consistency_p"] = float(rng.uniform())
                        for f in evaluate.CLEAN_TEST_FIELDS[1:]:
                            r[f] = float(rng.uniform())
                        for s in evaluate.OOD_SCORES:
                            for m in evaluate.OOD_FIELDS:
                                k = evaluate.ood_field(s, m[len("ood_") :])
                                if s != "mutual_information" or method != "ce":
                                    r[k] = float(rng.uniform())
                    rows.append(r)
    return agg.Rows(rows)


def _table(lines, first_cells):
    """``{tuple(first cells): {column: cell}}`` of a markdown table's lines."""
    body = [ln for ln in lines if ln.startswith("|")]
    header = [c.strip() for c in body[0].strip("|").split("|")]
    out = {}
    for ln in body[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[tuple(cells[:first_cells])] = dict(zip(header, cells, strict=True))
    return out


def test_report_tables_print_the_row_values():
    rows = _rows()

    def seeds(method, cal, field, shift="clean"):
        return [
            r[field]
            for r in sorted(rows, key=lambda r: r["seed"])
            if (r["method"], r["calibrator"], r["shift"]) == (method, cal, shift)
        ]

    t = _table(tables.calibration_tests_table(rows), 2)
    for method in ("ce", "ensemble(ce)"):
        for cal in ("none", "ts:nll"):
            cell = t[method, cal]
            for field, col in (
                ("spiegelhalter_p", "p (Spiegelhalter)"),
                ("ece_consistency_p", "p (consistency)"),
            ):
                want = "/".join(f"{v:.3f}" for v in seeds(method, cal, field))
                assert cell[col] == want
            # Share of shifted sets with p < 0.05, per seed, mean ± SEM.
            share = [
                np.mean(
                    [
                        r["spiegelhalter_p"] < 0.05
                        for r in rows
                        if (r["method"], r["calibrator"], r["seed"]) == (method, cal, s)
                        and r["shift"] != "clean"
                    ]
                )
                for s in range(3)
            ]
            v = np.float64(share)
            want = f"{100 * v.mean():.2f} ± {100 * v.std(ddof=1) / np.sqrt(3):.2f}"
            assert cell["shifted sets with Spiegelhalter p < 0.05"] == want
    m = _table(tables.metrics_table(rows, "none"), 1)
    assert m[("ce",)]["ece p (Spiegelhalter)"] == "/".join(
        f"{v:.3f}" for v in seeds("ce", "none", "spiegelhalter_p")
    )
    corp = _table(tables.corp_table(rows), 2)
    v = np.float64(seeds("ensemble(ce)", "ts:nll", "corp_log_mcb"))
    want = f"{v.mean():.4f} ± {v.std(ddof=1) / np.sqrt(3):.4f}"
    assert corp["ensemble(ce)", "ts:nll"]["Log MCB"] == want
    lines = tables.ood_table(rows, "patches")
    text = "\n".join(lines)
    assert "## OOD detection by every score against `patches`" in text
    ood = _table(text.split("by every score", 1)[1].splitlines(), 2)
    for score in evaluate.OOD_SCORES:
        col = f"{score} AUROC"
        v = np.float64(
            seeds("ensemble(ce)", "none", evaluate.ood_field(score, "auroc"))
        )
        want = f"{100 * v.mean():.2f} ± {100 * v.std(ddof=1) / np.sqrt(3):.2f}"
        assert ood["ensemble(ce)", "none"][col] == want
    assert ood["ce", "none"]["mutual_information AUROC"] == "-"


def test_ensemble_claims_evaluate_with_their_detectable_difference():
    rows = _rows()
    entries = {(e["paper"], e["claim"]): e for e in paper_claims.claims(rows)}
    paper = "Can you trust your model's uncertainty? (Ovadia et al. 2019)"
    shifted = entries[
        paper, "a deep ensemble has lower ECE under shift than TS on a single model"
    ]
    # Ensemble shifted ECE 0.05 + 0.001 s; ce + TS 0.08 + 0.001 s: -3 pp, SEM 0.
    assert shifted["measured"].startswith("shifted: ensemble(ce) - ce+TS -3.00 ± 0.00")
    assert shifted["detectable"] == "shifted: ensemble(ce) - ce+TS 0.00"
    assert shifted["verdict"] == "holds"
    plain = entries[
        paper,
        (
            "a deep ensemble has lower ECE than a single model, without TS, clean and "
            "under shift"
        ),
    ]
    assert "clean: ensemble(ce) - ce -1.00" in plain["measured"]
    assert "shifted: ensemble(ce) - ce -5.00" in plain["measured"]
    assert plain["verdict"] == "holds"


def _tiny_config():
    c = benchmark_digits.get_config()
    c.methods = ("ce", "mc_dropout", "ensemble(ce)")
    c.calibrators = ("none", "ts:nll")
    c.seeds = (0, 1)
    c.ensemble.size, c.ensemble.num_groups = 2, 2
    c.mc_dropout.num_samples = 4
    c.calibration_tests.num_samples = 20
    c.bootstrap.num_samples = 10
    c.train.num_steps = 24
    c.train.shifts.corruptions = "gaussian_noise"
    c.train.shifts.severities = (2,)
    return c


@pytest.mark.long
def test_tiny_grid_with_ensemble_and_mc_dropout(tmp_path):
    from calib_jax.benchmark import runner

    path = runner.run(_tiny_config(), tmp_path)
    rows = storage.read_jsonl(tmp_path / "results.jsonl")
    by = {(r["method"], r["calibrator"], r["seed"], r["shift"]): r for r in rows}
    shifts = {"clean", "gaussian_noise/2"}
    for method in ("ce", "mc_dropout", "ensemble(ce)"):
        for cal in ("none", "ts:nll"):
            for seed in (0, 1):
                for shift in shifts:
                    assert (method, cal, seed, shift) in by
    # ce's rows stay those of config.seeds; seeds 2, 3 were trained as
    # members of ensemble 1 only.
    assert {r["seed"] for r in rows if r["method"] == "ce"} == {0, 1}
    assert (grid.train_dir(tmp_path, "ce", 3) / "TRAINED").exists()
    # Ensemble 1's clean accuracy is that of the float64 mean of seeds 2, 3.
    probs, labels = 0.0, None
    for s in (2, 3):
        f = storage.load_npz(grid.train_dir(tmp_path, "ce", s) / "logits/test.npz")
        probs, labels = probs + _softmax64(f["logits"]) / 2, f["labels"]
    np.testing.assert_allclose(
        by["ensemble(ce)", "none", 1, "clean"]["accuracy"],
        np.mean(probs.argmax(-1) == labels),
        rtol=1e-6,
    )
    # Mutual information scores OOD for ensembles and MC dropout only.
    mi = "ood_mutual_information_auroc"
    for (method, _, _, shift), r in by.items():
        if shift == "clean":
            assert (mi in r) == (method != "ce")
            assert "ece_consistency_p" in r and "corp_log_mcb" in r
        assert 0.0 <= r["spiegelhalter_p"] <= 1.0
    f = storage.load_npz(grid.train_dir(tmp_path, "mc_dropout", 0) / "logits/test.npz")
    assert f["mutual_information"].shape == f["labels"].shape
    text = path.read_text()
    for heading in (
        "## Calibration tests (clean test set)",
        "## CORP decomposition of the Brier and log scores (clean test)",
        "## OOD detection by every score",
    ):
        assert heading in text
    assert "a deep ensemble has lower ECE under shift than TS" in text
    assert any((tmp_path / runner.COMPILATION_CACHE).iterdir())
