"""Mondrian APS/RAPS prediction sets of logits whose class axis is sharded
over the 8 CPU devices of the test session (issue 23).

One threshold per class needs each class's rank among all ``K`` classes of
its row, so the sets are computed on whole rows: an all-to-all over the
class axis hands each device ``N / 8`` whole rows, the sorted form runs on
them and a second all-to-all puts the bool sets back on the input's
sharding. bf16 logits ``[60, 64]`` (60 rows: not a multiple of 8, so each
device's block of rows is padded and cut) with the label's logit raised by 7 (a softmax piled
near 1.0) are placed ``P(None, 'vocab')`` on a 1 x 8 mesh and ``P('data',
'vocab')`` on a 2 x 4 mesh. The sets of APS and RAPS, randomised and not,
equal the one-device sets exactly, on the input's sharding; the scores equal
the one-device scores exactly; and the compiled program moves the logits by
an all-to-all, with no all-gather of rows at full ``K`` (the one-program
sorted form, compiled for the same input, has one: the parser sees it).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import conformal
from calib_jax.conformal import _mondrian, _predictor

N, K = 60, 64
LAM, K_REG = 0.05, 2
MESHES = {"1x8": ((1, 8), P(None, "vocab")), "2x4": ((2, 4), P("data", "vocab"))}
KEY = jax.random.key(7)

_COLLECTIVE = re.compile(
    r"= (?P<shape>\(.*?\)|\S+) (?P<op>all-gather|all-to-all|all-reduce|"
    r"reduce-scatter|collective-permute|collective-broadcast|ragged-all-to-all)"
    r"(?:-start)?\("
)
_ARRAY = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def collective_shapes(hlo: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    """``(op, [dims of each array of its result])`` of every collective of a
    compiled HLO text."""
    return [
        (
            m.group("op"),
            [
                tuple(int(d) for d in dims.split(",") if d)
                for dims in _ARRAY.findall(m.group("shape"))
            ],
        )
        for m in _COLLECTIVE.finditer(hlo)
    ]


def test_collective_shapes_parser():
    hlo = (
        "  %a = f32[60,64]{1,0} all-gather(f32[60,8]{1,0} %p), dims={1}\n"
        "  %b = (pred[8,8]{1,0}, pred[8,8]{1,0}) all-to-all(%x, %y), channel_id=1\n"
        "  %c = f32[] all-reduce(f32[] %z), to_apply=%add\n"
    )
    assert collective_shapes(hlo) == [
        ("all-gather", [(60, 64)]),
        ("all-to-all", [(8, 8), (8, 8)]),
        ("all-reduce", [()]),
    ]


@pytest.fixture(scope="module")
def case():
    """bf16 logits of a confident classifier (the label's logit + 7; bf16's
    8-bit mantissa gives tied logits, so ranks exercise the ties rule) and
    the four predictors, one threshold per class spread over the scores."""
    rng = np.random.default_rng(23)
    y = rng.integers(0, K, N)
    z = 2.0 * rng.standard_normal((N, K))
    z[np.arange(N), y] += 7.0
    z = z.astype(ml_dtypes.bfloat16)
    preds = {}
    for method, top in (("aps", 1.0), ("raps", 1.0 + LAM * (K - K_REG))):
        for randomized in (False, True):
            preds[method, randomized] = conformal.MondrianPredictor(
                qhat=jnp.asarray(rng.uniform(0.3, top, K), jnp.float32),
                lam=jnp.float32(LAM if method == "raps" else 0.0),
                method=method,
                k_reg=K_REG if method == "raps" else 0,
                randomized=randomized,
                num_classes=K,
            )
    return z, y.astype(np.int32), preds, {}


def _expected(case, name, what="sets"):
    """The one-device sets or scores of predictor ``name`` (cached)."""
    z, y, preds, expected = case
    if (name, what) not in expected:
        one = jax.device_put(z, jax.devices()[0])
        pred = preds[name]
        out = (
            pred.predict_sets(one, KEY) if what == "sets" else pred.scores(one, y, KEY)
        )
        expected[name, what] = np.asarray(out)
    return expected[name, what]


def _compiled_sets(pred, z, layout):
    u = _predictor.uniforms(KEY, N, jnp.float32) if pred.randomized else None
    return _mondrian._sets_core.lower(
        pred.method,
        z,
        pred.qhat,
        u,
        pred.lam,
        k_reg=pred.k_reg,
        allow_empty=pred.allow_empty,
        layout=layout,
    ).compile()


# make test: the sets of randomised APS on the 2 x 4 mesh (rows and classes
# split, rows padded); the other seven cases and the scores (a compile each)
# in make test-slow.
FAST = (("aps", True),)
REST = (("aps", False), ("raps", False), ("raps", True))


@pytest.mark.parametrize(
    ("mesh_name", "names", "with_scores"),
    [
        pytest.param("2x4", FAST, False, id="2x4"),
        pytest.param("2x4", FAST + REST, True, id="2x4-all", marks=pytest.mark.long),
        pytest.param("1x8", FAST + REST, True, id="1x8", marks=pytest.mark.long),
    ],
)
def test_sets_of_class_sharded_logits_equal_one_device_by_all_to_all(
    case, mesh_name, names, with_scores
):
    assert jax.device_count() == 8
    z, y, preds, _ = case
    shape, spec = MESHES[mesh_name]
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
    placed = NamedSharding(mesh, spec)
    zs = jax.device_put(z, placed)
    layout = _mondrian.rows_layout(zs)
    assert layout == (mesh, spec)
    for name in names:
        pred = preds[name]
        sets_one = _expected(case, name)
        assert 0 < sets_one.sum(1).mean() < K, name
        got = pred.predict_sets(zs, KEY)
        assert got.dtype == jnp.bool_ and got.sharding.is_equivalent_to(placed, 2)
        np.testing.assert_array_equal(np.asarray(got), sets_one, err_msg=str(name))
        if not with_scores:
            continue
        scores = np.asarray(pred.scores(zs, y, KEY))
        scores_one = _expected(case, name, "scores")
        np.testing.assert_array_equal(scores, scores_one, err_msg=str(name))
        # label in set exactly when its score is at most its class's qhat.
        np.testing.assert_array_equal(
            np.asarray(got)[np.arange(N), y], scores <= np.asarray(pred.qhat)[y]
        )
    # The program: the logits go by all-to-all, no all-gather carries rows at
    # full K, and every all-to-all moves a device's share.
    pred = preds[names[0]]
    found = collective_shapes(_compiled_sets(pred, zs, layout).as_text())
    to_all = [arrays for op, arrays in found if op == "all-to-all"]
    assert len(to_all) == 2, found
    # Each moves m whole rows' worth: the block of N / R rows padded to a
    # multiple of the C class devices, cut in C pieces of m rows.
    r, c = shape
    m = -(-(N // r) // c)
    for arrays in to_all:
        assert sum(int(np.prod(a)) for a in arrays) == m * K, arrays
    gathered = [a for op, arrays in found if op == "all-gather" for a in arrays]
    assert not [a for a in gathered if len(a) == 2 and a[-1] == K], found
    # Nothing but the two all-to-alls moves data between devices.
    assert [op for op, _ in found] == ["all-to-all"] * 2, found
    if mesh_name != "1x8":
        return
    # The one-program sorted form on the same input all-gathers the rows at
    # full K: what the parser would catch.
    found = collective_shapes(_compiled_sets(pred, zs, None).as_text())
    assert [a for op, arrays in found for a in arrays if a == (N, K)], found


def test_class_sharded_option_on_one_device_and_false_on_shards(case):
    """True on one device's logits is the one program (nothing to
    reshard); False on class-sharded logits keeps the one program; both
    give the one-device sets."""
    z, _, preds, _ = case
    pred = preds["aps", True]
    sets_one = _expected(case, ("aps", True))
    np.testing.assert_array_equal(
        pred.predict_sets(z, KEY, class_sharded=True), sets_one
    )
    assert _mondrian.rows_layout(jnp.asarray(z)) is None
    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "vocab"))
    zs = jax.device_put(z, NamedSharding(mesh, P(None, "vocab")))
    assert pred._layout(zs, False) is None and pred._layout(zs, True) is not None
    # THR stays elementwise: no reshard.
    thr = conformal.MondrianPredictor(
        qhat=pred.qhat, lam=jnp.float32(0), method="thr", num_classes=K
    )
    assert thr._layout(zs, True) is None
