"""``variant='released_code'``: values and gradients against float64 references.

The references (tests/_reference_released.py) follow the arithmetic of the
authors' repositories; gradients are float64 central differences of those
references with the released code's discrete choices held at the test point.
Every variant is checked in float32 at rtol 1e-5 on random, all-equal and
+-1e4 logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_released import (
    fd_grad,
    ref_acls_released,
    ref_au_hist_released,
    ref_au_pxtau_released,
    ref_au_score_released,
    ref_dual_focal_released,
    ref_mmce_released,
    ref_sb_ece_released,
)

from calib_jax import losses, metrics
from calib_jax.losses import _au_pxtau_hist


def _random(b=12, k=6, scale=2.0, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=scale, size=(b, k)).astype(np.float32)
    y = rng.integers(0, k, size=b).astype(np.int32)
    y = np.where(rng.random(b) < 0.5, x.argmax(1), y).astype(np.int32)
    return x, y


def _all_equal(b=12, k=6):
    return np.zeros((b, k), np.float32), (np.arange(b) % k).astype(np.int32)


def _extreme(b=12, k=6, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.choice([-1e4, 1e4], size=(b, k)).astype(np.float32)
    x[np.arange(b), rng.integers(0, k, size=b)] = 1e4
    y = rng.integers(0, k, size=b).astype(np.int32)
    return x, y


BATCHES = {"random": _random, "all_equal": _all_equal, "pm1e4": _extreme}

# name -> (library call, reference, hyperparameters); per-example losses are
# summed (the gradient of the sum is the row-wise gradient).
CASES = {
    "dual_focal": (
        lambda x, y, **kw: jnp.sum(losses.dual_focal(x, y, **kw)),
        ref_dual_focal_released,
        {"gamma": 2.0},
    ),
    "acls": (
        lambda x, y, **kw: jnp.sum(losses.acls(x, y, **kw)),
        ref_acls_released,
        {"margin": 1.0, "lambda_1": 0.3, "lambda_2": 0.2},
    ),
    "sb_ece": (losses.sb_ece, ref_sb_ece_released, {"temperature": 0.02}),
    "mmce": (
        lambda x, y, **kw: losses.mmce(x, y, weighted=True, **kw),
        ref_mmce_released,
        {"bandwidth": 0.4},
    ),
    "au_pxtau": (
        losses.au_pxtau,
        ref_au_pxtau_released,
        {"num_bins": 64, "nu": 0.05, "coverage": 0.7},
    ),
    "au_pxtau_margin": (
        losses.au_pxtau,
        ref_au_pxtau_released,
        {"num_bins": 20, "nu": 0.1, "coverage": 0.35, "csf": "softmax_margin"},
    ),
}


def _batch_for(name, batch):
    x, y = BATCHES[batch]()
    if name == "acls" and batch == "random":
        x = x * 3.0  # past the margin on most rows
    return x, y


@pytest.mark.long
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("name", list(CASES))
def test_value_matches_float64_reference(name, batch):
    fn, ref, kw = CASES[name]
    x, y = _batch_for(name, batch)
    got = float(fn(x, y, variant="released_code", **kw))
    want = float(np.sum(ref(x.astype(np.float64), y, **kw)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.long
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_float64_reference(name, batch):
    fn, ref, kw = CASES[name]
    x, y = _batch_for(name, batch)
    got = np.asarray(jax.grad(lambda v: fn(v, y, variant="released_code", **kw))(x))
    want = fd_grad(ref, x.astype(np.float64), y, **kw)
    scale = max(np.abs(want).max(), 1e-2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale)
    if batch == "random":
        # The comparison is of something (not two zero arrays).
        assert np.abs(got).max() > 1e-4


def test_au_pxtau_released_score_is_double_softmax():
    x, _ = _random(k=10)
    got = _au_pxtau_hist.au_score(jnp.asarray(x), "msp")
    np.testing.assert_allclose(got, ref_au_score_released(x), rtol=1e-6)
    k = 10
    assert float(got.min()) >= 1.0 / k - 1e-7
    assert float(got.max()) <= np.e / (np.e + k - 1) + 1e-7
    ent = _au_pxtau_hist.au_score(jnp.asarray(x), "neg_entropy")
    np.testing.assert_array_equal(np.asarray(ent), np.ones(len(x), np.float32))


def test_au_pxtau_released_running_hist_and_reset():
    """A running state updated before weighting; zeros = the per-epoch reset."""
    x1, _ = _random(seed=3)
    x2, y2 = _random(seed=4)
    kw = {"num_bins": 16, "nu": 0.05, "coverage": 0.5}
    h = jnp.zeros(16)
    h = losses.au_pxtau_update_hist(h, x1, variant="released_code")
    np.testing.assert_allclose(h, ref_au_hist_released(x1, 16))
    h = losses.au_pxtau_update_hist(h, x2, variant="released_code")
    np.testing.assert_allclose(
        h, ref_au_hist_released(x1, 16) + ref_au_hist_released(x2, 16)
    )
    got = losses.au_pxtau(x2, y2, hist=h, variant="released_code", **kw)
    want = ref_au_pxtau_released(x2.astype(np.float64), y2, hist=np.asarray(h), **kw)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    # After a reset the state holds one batch: the same as hist=None.
    h0 = losses.au_pxtau_update_hist(jnp.zeros(16), x2, variant="released_code")
    np.testing.assert_allclose(
        losses.au_pxtau(x2, y2, hist=h0, variant="released_code", **kw),
        losses.au_pxtau(x2, y2, variant="released_code", **kw),
        rtol=1e-6,
    )


def test_au_pxtau_released_tau_carries_gradient():
    """Rows above tau share the weight -log(1 - G(tau)): their own scores do not
    move it, but tau's two interpolation rows do (the released tau gradient)."""
    x, _ = _random(b=16, k=5, seed=7)
    kw = {"num_bins": 16, "nu": 0.05, "coverage": 0.5}

    def weights_sum(v):
        return jnp.sum(losses.au_pxtau_weights(v, variant="released_code", **kw))

    g = np.abs(np.asarray(jax.grad(weights_sum)(x))).sum(1)
    order = np.argsort(ref_au_score_released(x), kind="stable")
    # coverage 0.5 of 16 rows: tau interpolates sorted positions 7 and 8.
    assert g[order[8]] > 1e-6  # above tau, moved through tau only
    np.testing.assert_array_equal(g[order[9:]], 0.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, y: losses.au_pxtau(x, y, variant="code"),
        lambda x, y: losses.acls(x, y, variant="released"),
        lambda x, y: losses.dual_focal(x, y, variant="paper_code"),
        lambda x, y: losses.sb_ece(x, y, variant=None),
        lambda x, y: losses.mmce(x, y, variant="x"),
    ],
)
def test_unknown_variant_lists_the_valid_ones(call):
    x, y = _random()
    with pytest.raises(ValueError, match=r"Unknown variant=.*valid: 'paper'") as e:
        call(x, y)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda x, y: losses.sb_ece(x, y, kind="bin", variant="released_code"), "kind"),
        (lambda x, y: losses.sb_ece(x, y, p=1.0, variant="released_code"), "p=1.0"),
        (lambda x, y: losses.mmce(x, y, variant="released_code"), "weighted=False"),
        (
            lambda x, y: losses.mmce(
                x, y, weighted=True, squared=True, variant="released_code"
            ),
            "squared=True",
        ),
        (lambda x, y: losses.au_pxtau(x, y, tau=0.5, variant="released_code"), "tau"),
        (
            lambda x, y: losses.au_pxtau(
                x, y, weight_grad=False, variant="released_code"
            ),
            "weight_grad=False",
        ),
        (
            lambda x, y: jax.jit(
                lambda p: losses.sb_ece(x, y, p=p, variant="released_code")
            )(2.0),
            "a traced p",
        ),
        (
            lambda x, y: losses.au_pxtau_update_hist(
                jnp.zeros(8), x, decay=0.5, variant="released_code"
            ),
            "decay=0.5",
        ),
    ],
)
def test_variant_with_an_option_the_released_code_lacks(call, what):
    x, y = _random()
    with pytest.raises(ValueError, match="released code has no such option") as e:
        call(x, y)
    assert what in str(e.value) and "\n" not in str(e.value)


def test_composite_passes_variant():
    x, y = _random()
    objective = losses.composite(
        [
            {"name": "cross_entropy"},
            {"name": "acls", "variant": "released_code", "margin": 1.0},
            {"name": "au_pxtau", "variant": "released_code", "num_bins": 64},
        ]
    )
    _, logs = objective(x, y)
    np.testing.assert_allclose(
        logs["loss/acls"],
        jnp.mean(losses.acls(x, y, variant="released_code", margin=1.0)),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        logs["loss/au_pxtau"],
        losses.au_pxtau(x, y, variant="released_code", num_bins=64),
        rtol=1e-6,
    )
    # An unknown variant fails when the objective is built, before any compute.
    with pytest.raises(ValueError, match="Unknown variant='nope'"):
        losses.composite([{"name": "acls", "variant": "nope"}])
    with pytest.raises(ValueError, match="'reweighted_risk_description'"):
        losses.composite([{"name": "dual_focal", "variant": "x"}])
    losses.composite([{"name": "dual_focal", "variant": "reweighted_risk_description"}])


def test_dual_focal_released_differs_from_the_description_where_stated():
    """Misclassified rows with a class below the label: 'released_code' uses it,
    'reweighted_risk_description' drops the competitor altogether."""
    x, y = _random(b=64, k=10, seed=5)
    code = np.asarray(losses.dual_focal(x, y, gamma=2.0, variant="released_code"))
    desc = np.asarray(
        losses.dual_focal(x, y, gamma=2.0, variant="reweighted_risk_description")
    )
    p = np.asarray(jax.nn.softmax(x))
    p_y = p[np.arange(64), y]
    wrong = x.argmax(1) != y
    has_below = (p < p_y[:, None]).any(1)
    differ = ~np.isclose(code, desc, rtol=1e-6)
    np.testing.assert_array_equal(differ, wrong & has_below)
    assert differ.sum() > 5


# --- The tie rule: first arg-max == label, losses and metrics alike ----------


def test_tie_rule_sb_ece_and_ece_agree_on_all_equal_logits():
    """All-equal logits: only label 0 is correct, for the loss and the metric."""
    b, k = 40, 10
    x = np.zeros((b, k), np.float32)
    y = (np.arange(b) % 4).astype(np.int32)  # a quarter of the labels are 0
    probs = jax.nn.softmax(x)
    ece = float(metrics.ece(probs, y))
    np.testing.assert_allclose(ece, 0.25 - 0.1, rtol=1e-5)
    sb = float(losses.sb_ece(x, y, p=1.0, temperature=1e-6))
    np.testing.assert_allclose(sb, ece, rtol=1e-4)
    # The released (squared, l2) form on the same predictions: (0.25 - 0.1)^2.
    sq = float(losses.sb_ece(x, y, temperature=1e-6, variant="released_code"))
    np.testing.assert_allclose(sq, 0.15**2, rtol=1e-3)
    np.testing.assert_allclose(float(metrics.accuracy(probs, y)), 0.25, rtol=1e-6)


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("sb_ece", {"kind": "lb"}),
        ("sb_ece", {"kind": "bin", "p": 1.0}),
        ("sb_ece", {"variant": "released_code"}),
        ("avuc", {}),
        ("avuc_gs", {}),
        ("s_avuc", {}),
        ("mmce", {}),
        ("mmce", {"weighted": True}),
        ("mmce", {"weighted": True, "variant": "released_code"}),
        ("dual_focal", {"variant": "reweighted_risk_description"}),
    ],
)
@pytest.mark.long
def test_tie_rule_every_loss_that_uses_correctness(name, kw):
    """On all-equal logits a loss sees label 0 as correct and every other label
    as wrong: relabelling the wrong rows among 1..K-1 changes nothing, moving a
    row to label 0 does (the loss notices the changed correctness)."""
    fn = losses.get_loss(name)
    b, k = 16, 5
    x = np.zeros((b, k), np.float32)
    y = (np.arange(b) % k).astype(np.int32)
    base = np.asarray(fn(x, y, **kw))
    y_other = np.where(y == 0, 0, 1 + (y % (k - 1))).astype(np.int32)
    np.testing.assert_allclose(np.asarray(fn(x, y_other, **kw)), base, rtol=1e-6)
    y_more = np.zeros_like(y)  # every row correct
    assert not np.allclose(np.asarray(fn(x, y_more, **kw)), base, rtol=1e-4)


def test_tie_rule_metrics_on_all_equal_probabilities():
    """Every correctness-based metric counts only label 0 as correct."""
    b, k = 20, 5
    probs = np.full((b, k), 1.0 / k, np.float32)
    y = (np.arange(b) % k).astype(np.int32)  # a fifth are label 0
    np.testing.assert_allclose(float(metrics.accuracy(probs, y)), 0.2, rtol=1e-6)
    # Confidence 1/K = accuracy 1/5: perfectly calibrated, ECE 0.
    assert float(metrics.ece(probs, y)) < 1e-6
    y1 = np.where(y == 0, 1, y).astype(np.int32)  # no label 0: accuracy 0
    np.testing.assert_allclose(float(metrics.ece(probs, y1)), 0.2, rtol=1e-5)
    np.testing.assert_allclose(float(metrics.accuracy(probs, y1)), 0.0, atol=0)


METRICS_USING_CORRECTNESS = [
    ("accuracy", {}),
    ("ece", {}),
    ("ece", {"p": 2}),
    ("mce", {}),
    ("rmsce", {}),
    ("adaptive_ece", {}),
    ("sweep_ece", {}),
    ("debiased_ece", {}),
    ("ks_error", {}),
    ("aurc", {}),
    ("eaurc", {}),
    ("augrc", {}),
    ("risk_at_coverage", {"coverage": 0.5}),
    ("coverage_at_risk", {"risk": 0.9}),
    ("smooth_ece", {}),
    ("smooth_reliability", {}),
    ("reliability_bins", {}),
    ("reliability_bins", {"binning": "equal_mass"}),
]


@pytest.mark.parametrize(
    ("name", "kw"), METRICS_USING_CORRECTNESS, ids=lambda v: str(v)
)
@pytest.mark.long
def test_tie_rule_every_metric_that_uses_correctness(name, kw):
    """All-equal rows give the value of rows whose class 0 is the unique top
    by a hair: the tie goes to the first class, for every metric."""
    fn = metrics.METRICS[name]
    b, k = 40, 5
    rng = np.random.default_rng(0)
    y = rng.integers(0, k, size=b).astype(np.int32)
    tied = np.full((b, k), 1.0 / k, np.float64)
    bumped = tied.copy()
    bumped[:, 0] += 1e-6
    bumped /= bumped.sum(1, keepdims=True)
    got = jax.tree.map(np.asarray, fn(tied.astype(np.float32), y, **kw))
    want = jax.tree.map(np.asarray, fn(bumped.astype(np.float32), y, **kw))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    # The smoothed curve moves with the 1e-6 bump's shift of the bandwidth by
    # ~5e-4; the other rule (every tied row correct) would move it by ~0.8.
    atol = 2e-3 if name == "smooth_reliability" else 1e-5
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol)
    # ... and not the value the "label among the tied classes" rule would give
    # for accuracy-like metrics (every row correct).
    if name == "accuracy":
        np.testing.assert_allclose(got, np.mean(y == 0), rtol=1e-6)
