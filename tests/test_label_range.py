"""Labels outside ``[0, K)`` are rejected at every host-facing entry point,
also when they do not fit in int32 (JAX's default label dtype, to which a
NumPy int64 label such as ``2**32 + 3`` would otherwise wrap to a valid id)."""

from __future__ import annotations

import numpy as np
import pytest

from calib_jax import _checks, conformal, metrics, posthoc
from calib_jax.posthoc import _cli as posthoc_cli

RNG = np.random.default_rng(0)
K = 4
LABELS = RNG.integers(0, K, 40)
LOGITS = RNG.normal(size=(40, K)).astype(np.float32)
LOGITS[np.arange(40), LABELS] += 2.0
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)

WIDE = (2**32 + 3, 2**40, -(2**33))


def _one_line(err: BaseException | str) -> str:
    text = str(err).strip()
    assert text and "\n" not in text, text
    return text


def _with_label(value, row: int = 5, *, as_list: bool = False):
    labels = LABELS.astype(np.int64)
    labels[row] = value
    return [int(v) for v in labels] if as_list else labels


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("value", WIDE)
def test_fit_metric_and_conformal_reject_labels_beyond_int32(value, as_list):
    labels = _with_label(value, as_list=as_list)
    fit_msg = f"labels must lie in [0, K) = [0, {K}); found {value} at row 5 (1 label"
    with pytest.raises(ValueError) as err:
        posthoc.fit("ts:nll", LOGITS, labels)
    assert fit_msg in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        conformal.fit("thr", LOGITS, labels, alpha=0.2)
    assert fit_msg in _one_line(err.value)
    with pytest.raises(ValueError) as err:
        metrics.ece(PROBS, labels)
    assert fit_msg in _one_line(err.value)


# The OOD metrics take two score arrays, not labels.
OOD = {"fpr_at_95_tpr", "ood_aupr", "ood_auroc"}


@pytest.mark.parametrize("name", sorted(set(metrics.METRICS) - OOD))
def test_every_metric_rejects_a_label_beyond_int32(name):
    options = {"risk_at_coverage": {"coverage": 0.5}, "coverage_at_risk": {"risk": 0.1}}
    with pytest.raises(ValueError) as err:
        metrics.get_metric(name)(PROBS, _with_label(2**32 + 1), **options.get(name, {}))
    assert f"found {2**32 + 1} at row 5" in _one_line(err.value)


@pytest.mark.long
def test_first_included_row_is_named_and_masked_rows_are_ignored():
    labels = _with_label(2**40, row=9)
    labels[3] = K  # in the int32 range but out of [0, K): the first bad row
    where = np.ones(40, bool)
    with pytest.raises(ValueError) as err:
        posthoc.fit("ts", LOGITS, labels, where=where)
    assert f"found {K} at row 3 (2 label(s) out of range)" in _one_line(err.value)
    # Padding rows excluded by the mask may hold any label.
    where[[3, 9]] = False
    t = posthoc.fit("ts", LOGITS, labels, where=where).params["temperature"]
    ref = posthoc.fit("ts", LOGITS[where], LABELS[where]).params["temperature"]
    np.testing.assert_allclose(float(t), float(ref), rtol=1e-5)


def test_check_host_labels_leaves_in_range_labels_alone():
    labels = LABELS.astype(np.int64)
    out = _checks.check_host_labels(labels, K)
    assert out.dtype == np.int64 and (out == labels).all()
    # Values inside int32 are left to the fused check (-1 padding, K).
    assert (_checks.check_host_labels(np.array([-1, K]), K) == [-1, K]).all()
    with pytest.raises(ValueError, match=r"found 4294967296 at row 1 \(1 label"):
        _checks.check_host_labels(np.array([0, 2**32], np.uint64), K)


def test_posthoc_cli_rejects_a_label_beyond_int32(tmp_path, capsys):
    np.savez(tmp_path / "val.npz", logits=LOGITS, labels=_with_label(2**40))
    np.savez(tmp_path / "test.npz", logits=LOGITS, labels=LABELS)
    code = posthoc_cli.main(
        [
            "--val",
            str(tmp_path / "val.npz"),
            "--test",
            str(tmp_path / "test.npz"),
            "--method",
            "ts",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    line = _one_line(err)
    assert "--val" in line and f"found {2**40} at row 5" in line
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# Conformal: coverage and the score functions gather at the label, which
# clamps an out-of-range one; concrete labels are checked first.
# ---------------------------------------------------------------------------

SETS = np.zeros((4, 10), bool)
SETS[:, 9] = True


@pytest.mark.parametrize("bad", [15, -1, 10, 2**40])
def test_coverage_rejects_labels_outside_range(bad):
    assert float(conformal.coverage(SETS, np.array([9, 9, 9, 9]))) == 1.0
    labels = np.array([9, 9, bad, 9])
    for fn in (
        conformal.coverage,
        lambda s, y: conformal.size_stratified_coverage(s, y)[0],
        lambda s, y: conformal.size_stratified_violation(s, y, alpha=0.1),
    ):
        with pytest.raises(ValueError) as err:
            fn(SETS, labels)
        assert f"labels must lie in [0, K) = [0, 10); found {bad} at row 2" in (
            _one_line(err.value)
        )


def test_coverage_ignores_masked_rows_and_checks_nothing_under_jit():
    import jax

    labels = np.array([9, 9, 15, 9])
    where = np.array([True, True, False, True])
    assert float(conformal.coverage(SETS, labels, where=where)) == 1.0
    traced = jax.jit(conformal.coverage)(SETS, np.array([9, 9, 9, 0]))
    assert float(traced) == 0.75


@pytest.mark.parametrize("bad", [K, -1])
def test_conformal_scores_reject_labels_outside_range(bad):
    labels = LABELS.copy()
    labels[7] = bad
    predictor = conformal.fit("aps", LOGITS, LABELS, alpha=0.2)
    calls = {
        "thr_score": lambda: conformal.thr_score(PROBS, labels),
        "aps_score": lambda: conformal.aps_score(PROBS, labels),
        "raps_score": lambda: conformal.raps_score(PROBS, labels, lam=0.1, k_reg=1),
        "predictor.scores": lambda: predictor.scores(LOGITS, labels),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as err:
            call()
        assert f"[0, {K}); found {bad} at row 7" in _one_line(err.value), name


@pytest.mark.long
@pytest.mark.parametrize("name", ["ts", "ts:sb_ece", "ets", "cts", "vector"])
def test_label_of_an_excluded_row_does_not_change_the_fit(name):
    where = np.ones(40, bool)
    where[3] = False
    fits = []
    for padding in (0, K, -1):
        labels = LABELS.copy()
        labels[3] = padding
        cal = posthoc.fit(name, LOGITS, labels, where=where)
        fits.append(np.asarray(cal.probs(LOGITS)))
    assert np.isfinite(fits[0]).all()
    np.testing.assert_allclose(fits[1], fits[0], atol=1e-6)
    np.testing.assert_allclose(fits[2], fits[0], atol=1e-6)
