"""``ConformalPredictor.predict_sets`` on logits whose class axis is sharded
over the 8 CPU devices of the test session (issue 23).

A predictor fitted on one device is given the same bf16 logits placed by
``sharding.shard_classes`` on a 1 x 8 (``P(None, 'vocab')``) and a 2 x 4
(``P('data', 'vocab')``) mesh. It takes the row-sum form by itself (the
label's rank and the mass before it as row sums, the sets by a bisection of
row sums), so the compiled set prediction's collectives move ``O(N)`` values,
never a block of ``[N, K]`` (the sorted form, compiled for the same input,
all-gathers it). Its sets equal the one-device sets of the same form
exactly, and the one-device sorted sets but for classes whose score is
within float32 rounding of ``qhat``; ``scores`` agree to 1e-6 and ``label in
set`` exactly when ``score <= qhat``. Unsharded logits keep the sorted form
bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh

from calib_jax import conformal
from calib_jax.conformal import _mondrian, _predictor, _scores
from calib_jax.sharding import shard_classes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from test_conformal_sharded import LAM, K_REG, N, K, _case  # noqa: E402
from test_vocab_sharded import collectives  # noqa: E402

MESHES = {"1x8": ((1, 8), None), "2x4": ((2, 4), "data")}
ALPHA = 0.1


def _fits():
    """THR, APS (randomised) and RAPS fitted on the first half of the rows
    (one device), and the key of the randomised sets."""
    z, y, _ = _case()
    cal = slice(0, N // 2)
    key = jax.random.key(3)
    return {
        "thr": conformal.fit("thr", z[cal], y[cal], alpha=ALPHA),
        "aps": conformal.fit("aps", z[cal], y[cal], alpha=ALPHA, key=key),
        "raps": conformal.fit(
            "raps", z[cal], y[cal], alpha=ALPHA, lam=LAM, k_reg=K_REG
        ),
    }, jax.random.key(4)


def _lowered_sets(pred, z, key, row_sums):
    u = _predictor.uniforms(key, z.shape[0], jnp.float32) if pred.randomized else None
    return _predictor._sets_core.lower(
        pred.method,
        z,
        pred.qhat,
        u,
        pred.lam,
        k_reg=pred.k_reg,
        allow_empty=pred.allow_empty,
        class_sharded=row_sums,
    ).compile()


@pytest.mark.long
@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_sets_of_class_sharded_logits_equal_one_device_and_move_no_block(
    mesh_name,
):
    assert jax.device_count() == 8
    z, y, _ = _case()
    fits, key = _fits()
    # The held-out half: no row's score is qhat itself (a calibration
    # row's), which any rounding would move across.
    z, y = z[N // 2 :], y[N // 2 :]
    n = N // 2
    shape, data_axis = MESHES[mesh_name]
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
    zs, ys = shard_classes(z, y, mesh=mesh, data_axis=data_axis)
    one = jax.device_put(z, jax.devices()[0])
    for name, pred in fits.items():
        got = np.asarray(pred.predict_sets(zs, key))
        assert 0 < got.sum(1).mean() < K, name
        # Scores: the same to 1e-6, and label in set exactly when score <= qhat.
        s_one = np.asarray(pred.scores(one, y, key))
        s_got = np.asarray(pred.scores(zs, ys, key))
        # THR's 1 - p_y: the softmax's row sums add per device (1e-6 absolute).
        atol = 1e-6 if name == "thr" else 1e-7
        np.testing.assert_allclose(s_got, s_one, rtol=1e-6, atol=atol)
        with_label = got[np.arange(n), y]
        np.testing.assert_array_equal(with_label, s_got <= np.asarray(pred.qhat))
        if name == "thr":
            # Elementwise on the softmax: one form, the same sets.
            np.testing.assert_array_equal(got, pred.predict_sets(one), err_msg=name)
            continue
        # APS/RAPS: the one-device sets, of the row-sum form and of the
        # sorted form (one device's default), entry for entry but for the
        # classes whose score is within float32 rounding of qhat (1e-6;
        # near 1.0 float32 steps by 6e-8 and a fitted qhat is a score on
        # that grid, so a test row's class score can equal it, and the mass
        # added per device, in class order or in ranked order may round
        # either way): 0.07% of the entries for APS here (qhat 0.99989).
        u = _predictor.uniforms(key, n, jnp.float32) if pred.randomized else None
        probs = jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1)
        each = np.asarray(
            _mondrian.class_scores(probs, u, pred.lam, method=name, k_reg=pred.k_reg)
        )
        q = float(pred.qhat)
        near = np.abs(each - q) <= 1e-6 * max(1.0, abs(q))
        assert near.mean() < 1e-3, (name, near.sum())
        by_sums = np.asarray(pred.predict_sets(one, key, class_sharded=True))
        by_sort = np.asarray(pred.predict_sets(one, key))
        np.testing.assert_array_equal(got[~near], by_sums[~near], err_msg=name)
        np.testing.assert_array_equal(got[~near], by_sort[~near], err_msg=name)
        # The choice: row sums for the sharded logits, the sort otherwise.
        assert pred._row_sums(zs, None) and not pred._row_sums(one, None)
        found = collectives(_lowered_sets(pred, zs, key, True).as_text())
        assert found, "a class-sharded program reduces across devices"
        too_big = [(op, m) for op, m in found if m > 4 * n]
        assert not too_big, (name, too_big)
        if name != "aps":
            continue
        # The sorted form on the same input moves [N, K] blocks: the parser
        # sees what the row sums avoid.
        sorted_form = collectives(_lowered_sets(pred, zs, key, False).as_text())
        assert max(m for _, m in sorted_form) >= n * K // 8, name
    # Fitted on the class-sharded calibration rows: the row-sum scores, the
    # same threshold to 1e-6, and the scoring program moves O(N) values.
    z_all, y_all, _ = _case()
    zc, yc = shard_classes(
        z_all[: N // 2], y_all[: N // 2], mesh=mesh, data_axis=data_axis
    )
    for name in ("aps", "raps"):
        pred = fits[name]
        kw = {"lam": LAM, "k_reg": K_REG} if name == "raps" else {}
        key_fit = jax.random.key(3) if pred.randomized else None
        for mondrian in (False, True):
            extra = {"mondrian": True, "absent": "full"} if mondrian else {}
            on_shards = conformal.fit(
                name, zc, yc, alpha=ALPHA, key=key_fit, **kw, **extra
            )
            on_one = conformal.fit(
                name,
                z_all[: N // 2],
                y_all[: N // 2],
                alpha=ALPHA,
                key=key_fit,
                **kw,
                **extra,
            )
            np.testing.assert_allclose(
                on_shards.qhat, on_one.qhat, rtol=1e-6, atol=1e-7
            )
        u = (
            _predictor.uniforms(key_fit, N // 2, jnp.float32)
            if key_fit is not None
            else None
        )
        program = _predictor.scores_core.lower(
            name, zc, yc, u, pred.lam, k_reg=pred.k_reg, class_sharded=True
        ).compile()
        too_big = [(op, m) for op, m in collectives(program.as_text()) if m > 4 * n]
        assert not too_big, (name, too_big)
    # Mondrian THR: elementwise sets (1 - p <= qhat[class]), per shard as
    # they are; the same sets but within rounding of a class's threshold.
    mondrian = conformal.fit(
        "thr", *_case()[:2], alpha=0.5, mondrian=True, absent="full"
    )
    got = np.asarray(mondrian.predict_sets(zs))
    p32 = np.asarray(jax.nn.softmax(jnp.asarray(z, jnp.float32), axis=-1))
    near = np.abs(1.0 - p32 - np.asarray(mondrian.qhat)[None, :]) <= 1e-6
    assert near.mean() < 1e-2, near.sum()
    np.testing.assert_array_equal(
        got[~near], np.asarray(mondrian.predict_sets(one))[~near]
    )


def _small_case():
    """bf16 logits [96, 8], a third of the rows confident (softmax at 1.0)."""
    rng = np.random.default_rng(11)
    z = 2.0 * rng.standard_normal((96, 8))
    y = rng.integers(0, 8, 96)
    sure = rng.random(96) < 0.35
    z[sure, y[sure]] += rng.uniform(12.0, 30.0, sure.sum())
    return z.astype(ml_dtypes.bfloat16), y.astype(np.int32)


def _sorted_program(z, y, qhat, lam):
    """The sets and scores of the predictor before the row-sum choice: one
    jitted program of the float32 softmax and the sorted forms."""
    probs = jax.nn.softmax(z.astype(jnp.float32), axis=-1)
    sets = _scores.raps_sets_core(probs, qhat, None, lam, k_reg=K_REG)
    return sets, _scores.raps_score_core(probs, y, None, lam, k_reg=K_REG)


def test_unsharded_logits_keep_the_sorted_form_bit_for_bit():
    """Auto on one device is the sorted form, bit for bit; the row sums,
    forced, give the same sets on these held-out rows."""
    z, y = _small_case()
    # A RAPS threshold amid the scores of these rows (none within 1e-3).
    pred = conformal.ConformalPredictor(
        qhat=jnp.float32(0.95),
        lam=jnp.float32(LAM),
        method="raps",
        k_reg=K_REG,
        num_classes=8,
    )
    sets, scores = jax.jit(_sorted_program)(z, y, pred.qhat, pred.lam)
    np.testing.assert_array_equal(pred.predict_sets(z), sets)
    np.testing.assert_array_equal(pred.scores(z, y), scores)
    assert 0 < np.asarray(sets).sum(1).mean() < 8
    assert np.min(np.abs(np.asarray(scores) - 0.95)) > 1e-3
    np.testing.assert_array_equal(pred.predict_sets(z, class_sharded=True), sets)


def test_class_sharded_option_errors_are_one_line():
    z, _ = _small_case()
    mondrian = conformal.MondrianPredictor(
        qhat=jnp.full((8,), 0.9), lam=jnp.float32(0), method="aps", num_classes=8
    )
    marginal = conformal.ConformalPredictor(
        qhat=jnp.float32(0.9), lam=jnp.float32(0), method="aps", num_classes=8
    )
    for pred in (mondrian, marginal):
        with pytest.raises(ValueError) as err:
            pred.predict_sets(z, class_sharded="yes")
        assert str(err.value) == (
            "class_sharded must be None (decided by the logits' placement), True "
            "or False, got 'yes'."
        )
