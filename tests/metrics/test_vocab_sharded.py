"""Metrics with the class axis sharded over the 8 CPU devices (issue 23).

Probabilities ``[N, K]`` sharded ``P(None, 'vocab')`` on a 1 x 8 mesh and
``P('data', 'vocab')`` on a 2 x 4 mesh go through one jitted program of every
metric: its values equal the one-device program's (counts, confidences,
correctness and order statistics exactly, sums to 1e-6 relative), and the
compiled HLO's collectives move O(N) or O(K * bins) elements, never a
shard of the ``[N, K]`` array. The class-sharding-friendly kernel forms the
CPU picks with more than one device are checked bit for bit against the
single-device forms (``_cpu_kernels``).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import metrics
from calib_jax.metrics import _common, _conventions, _cpu_kernels
from calib_jax.sharding import shard_classes

N, K = 1024, 512
BINS = 15

# "%x = f32[128,64]{1,0} all-gather(...)" or "(u32[8], f32[8]) all-reduce-start(".
_COLLECTIVE = re.compile(
    r"= (?P<shape>\(.*?\)|\S+) "
    r"(?P<op>all-gather|all-to-all|all-reduce|reduce-scatter|collective-permute|"
    r"collective-broadcast|ragged-all-to-all)(?:-start)?\("
)
_ARRAY = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def _case():
    """Softmax rows piled at and just below 1.0 (``1 - p`` down to float32
    spacing), ties of the maximum across shards, labels at, before and after
    the maximum."""
    rng = np.random.default_rng(23)
    top = rng.choice(
        np.float32([1.0, 0.99999994, 0.9999, 0.99995, 0.97, 0.6, 0.3]), size=N
    )
    rest = rng.random((N, K)).astype(np.float32)
    rest *= ((1.0 - top) / rest.sum(1))[:, None]
    col = rng.integers(0, K, N)
    probs = rest
    probs[np.arange(N), col] = top
    # A second maximal class in a third of the rows, mostly on another shard.
    twin = (col + rng.integers(1, K, N)) % K
    tie = rng.random(N) < 0.33
    probs[np.arange(N)[tie], twin[tie]] = top[tie]
    pick = rng.random(N)
    labels = np.where(
        pick < 0.45, col, np.where(pick < 0.7, twin, rng.integers(0, K, N))
    )
    return probs.astype(np.float32), labels.astype(np.int32)


def _all_metrics(p, y):
    conv = _conventions.get_convention("calib_jax")
    conf, correct = _common.top_label(p, y)
    top = metrics.BinnedStats.from_batch(p, y, num_bins=BINS)
    cw = metrics.BinnedStats.from_batch(p, y, num_bins=BINS, classwise=True)
    return {
        "conf": conf,
        "correct": correct,
        "ece": metrics.ece(p, y, num_bins=BINS),
        "ece_l2": metrics.ece(p, y, num_bins=BINS, p=2),
        "adaptive_ece": metrics.adaptive_ece(p, y, num_bins=BINS),
        "classwise_ece": metrics.classwise_ece(p, y, num_bins=BINS, convention=conv),
        "nll": metrics.nll(p, y),
        "brier": metrics.brier(p, y),
        "accuracy": metrics.accuracy(p, y),
        "aurc": metrics.aurc(p, y),
        "stats": top,
        "stats_ece": top.compute(),
        "classwise_stats": cw,
        "classwise_stats_ece": cw.compute(),
    }


_program = jax.jit(_all_metrics)


@pytest.fixture(scope="module")
def case():
    return _case()


@pytest.fixture(scope="module")
def one_device(case):
    probs, labels = case
    dev = jax.devices()[0]
    out = _program(jax.device_put(probs, dev), jax.device_put(labels, dev))
    return jax.tree.map(np.asarray, out)


MESHES = {"1x8": ((1, 8), P(None, "vocab")), "2x4": ((2, 4), P("data", "vocab"))}


def _sharded(case, mesh_name):
    probs, labels = case
    shape, spec = MESHES[mesh_name]
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
    return shard_classes(probs, labels, mesh=mesh, data_axis=spec[0])


def collectives(hlo: str) -> list[tuple[str, int]]:
    """``(op, elements)`` of every collective of a compiled HLO text, the
    elements of a tuple-shaped one summed over its arrays."""
    out = []
    for m in _COLLECTIVE.finditer(hlo):
        size = 0
        for dims in _ARRAY.findall(m.group("shape")):
            size += int(np.prod([int(d) for d in dims.split(",") if d]))
        out.append((m.group("op"), size))
    return out


def test_collective_parser_reads_shapes():
    hlo = (
        "  %a = f32[4096,2048]{0,1} all-gather(f32[4096,256]{0,1} %p), dims={1}\n"
        "  %b = (u32[64]{0}, f32[64,1]{1,0}) all-reduce-start(%x, %y), to_apply=%m\n"
        "  %c = f32[] all-reduce(f32[] %z), to_apply=%add\n"
    )
    assert collectives(hlo) == [
        ("all-gather", 4096 * 2048),
        ("all-reduce", 128),
        ("all-reduce", 1),
    ]


def _assert_small_collectives(compiled, n, k):
    """Every collective carries at most ``max(N, K * (bins + 1))`` elements,
    far below one device's ``[N, K]`` shard (so none moves rows by classes)."""
    found = collectives(compiled.as_text())
    assert found, "a sharded program reduces across devices"
    bound = max(n, k * (BINS + 1))
    assert bound * 4 <= n * k // 8
    too_big = [(op, size) for op, size in found if size > bound]
    assert not too_big, too_big


def test_kernels_split_along_classes():
    """The two CPU kernels that used to gather ``[N, K]`` (the packed-key top
    label, the class-wise scatter) on a 1 x 8 class-sharded mesh: no large
    collective, and the values against NumPy (make-test sized)."""
    probs, labels = _case()
    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "vocab"))
    p = jax.device_put(probs, NamedSharding(mesh, P(None, "vocab")))

    def kernels(p, y):
        stats = metrics.BinnedStats.from_batch(p, y, num_bins=BINS, classwise=True)
        return _common.top_label(p, y, screen=True), stats.count, stats.sum_correct

    compiled = jax.jit(kernels).lower(p, labels).compile()
    (conf, correct, sums), count, n_correct = compiled(p, labels)
    _assert_small_collectives(compiled, N, K)
    np.testing.assert_array_equal(conf, probs.max(1))
    np.testing.assert_array_equal(correct, probs.argmax(1) == labels)
    np.testing.assert_allclose(sums, probs.astype(np.float64).sum(1), rtol=1e-6)
    edges = _conventions.edges(_conventions.get_convention("calib_jax"), BINS)
    bins = np.clip(np.searchsorted(edges, probs, side="right") - 1, 0, BINS - 1)
    want = np.zeros((K, BINS), np.int64)
    np.add.at(want, (np.broadcast_to(np.arange(K), probs.shape), bins), 1)
    np.testing.assert_array_equal(count, want)
    np.testing.assert_array_equal(
        np.sum(n_correct, axis=1), np.bincount(labels, minlength=K)
    )


@pytest.mark.long
@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_class_sharded_equals_one_device_and_moves_no_rows_of_classes(
    case, one_device, mesh_name
):
    assert jax.device_count() == 8
    probs, labels = case
    p, y = _sharded(case, mesh_name)
    compiled = _program.lower(p, y).compile()
    got = jax.tree.map(np.asarray, compiled(p, y))

    # Top label against float64 NumPy: the row max and the first-maximum rule.
    np.testing.assert_array_equal(got["conf"], probs.max(1))
    np.testing.assert_array_equal(got["correct"], probs.argmax(1) == labels)
    p64 = probs.astype(np.float64)
    p_label = p64[np.arange(N), labels]
    nll = -np.log(np.maximum(p_label, np.finfo(np.float32).tiny)).mean()
    np.testing.assert_allclose(got["nll"], nll, rtol=1e-6)
    brier = ((p64**2).sum(1) - 2 * p_label + 1).mean()
    np.testing.assert_allclose(got["brier"], brier, rtol=1e-6)

    # Exact: confidences, correctness, counts; order statistics (adaptive
    # ECE bins, AURC) come from the exact confidences. Float32 sums: 1e-6.
    for name in ("conf", "correct", "accuracy"):
        np.testing.assert_array_equal(got[name], one_device[name], err_msg=name)
    for name in ("stats", "classwise_stats"):
        for field in ("count", "sum_correct", "total"):
            np.testing.assert_array_equal(
                getattr(got[name], field),
                getattr(one_device[name], field),
                err_msg=f"{name}.{field}",
            )
        # Float32 sums in another order; the class-wise bin 0 is a column
        # total minus the other bins, so its error is relative to the total.
        want = one_device[name].sum_conf
        scale = np.abs(want).sum(axis=-1, keepdims=True)
        assert np.all(np.abs(got[name].sum_conf - want) <= 1e-6 * scale), name
    # The top-label bin sums go by blocks of rows (``_kernels``): 1024 or 512
    # rows a device, a multiple of the block, keep every block on one device.
    np.testing.assert_array_equal(got["stats"].sum_conf, one_device["stats"].sum_conf)
    for name in (
        "ece",
        "ece_l2",
        "adaptive_ece",
        "classwise_ece",
        "nll",
        "brier",
        "aurc",
        "stats_ece",
        "classwise_stats_ece",
    ):
        np.testing.assert_allclose(got[name], one_device[name], rtol=1e-6, err_msg=name)

    # No collective moves a block of rows by classes.
    _assert_small_collectives(compiled, N, K)


def _near_one(n, k, seed):
    rng = np.random.default_rng(seed)
    top = rng.choice(np.float32([1.0, 0.99999994, 0.9999, 0.6]), size=n)
    probs = rng.random((n, k)).astype(np.float32) * ((1.0 - top) / k)[:, None]
    col = rng.integers(0, k, n)
    probs[np.arange(n), col] = top
    twin = rng.integers(0, k, n)
    probs[np.arange(n)[: n // 3], twin[: n // 3]] = top[: n // 3]
    labels = np.where(rng.random(n) < 0.5, col, twin).astype(np.int32)
    return jnp.asarray(probs), jnp.asarray(labels)


_grouped = jax.jit(_cpu_kernels._top_label_grouped, static_argnums=(2, 3))
_blocks = jax.jit(_cpu_kernels._top_label_blocks, static_argnums=(2, 3))


@pytest.mark.parametrize("k", [384, 1000])
def test_grouped_top_label_is_the_blocked_kernel_bit_for_bit(k):
    """The ``[N, K / g, g]`` view of the packed-key top label (what the CPU
    runs) against the ``[N * K / g, g]`` blocks of the single-device program
    and against NumPy; the group size keeps ``K / g`` a multiple of the
    class ways where K allows (384 on 8 devices: g = 24, not 32)."""
    p, y = _near_one(256, k, k)
    groups = {_cpu_kernels._group_size(k, ways) for ways in (1, 8)}
    for g in groups:
        assert k % g == 0 and 8 <= g <= 32
        for screen in (False, True):
            got = _grouped(p, y, screen, g)
            want = _blocks(p, y, screen, g)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (k // _cpu_kernels._group_size(k, 8)) % 8 == 0
    assert _cpu_kernels._group_size(384, 1) == 32
    assert _cpu_kernels._group_size(384, 8) == 24
    assert _cpu_kernels._group_size(64, 8) == 8
    np.testing.assert_array_equal(
        np.asarray(got[1]), np.asarray(p).argmax(1) == np.asarray(y)
    )


@pytest.mark.parametrize("preset", ["calib_jax", "torchmetrics"])
def test_class_batched_scatter_is_the_flattened_scatter_bit_for_bit(preset):
    """The class-wise per-bin sums with the class as a batch dimension of
    the scatter (more than one device) against the flattened scatter of the
    single-device program, and the counts against NumPy."""
    conv = _conventions.get_convention(preset)
    p, _ = _near_one(300, 40, 5)
    slots = _conventions.num_slots(conv, BINS)

    @jax.jit
    def both(p):
        bins = _conventions.bin_index(p, BINS, conv)
        keep = (bins >= 0) & (jnp.arange(300) % 7 != 3)[:, None]
        val = jax.lax.complex(p, jnp.ones_like(p))
        sums = [_cpu_kernels._class_bin_sums(val, bins, keep, slots, f) for f in (0, 1)]
        return sums, bins, keep

    (flat, batched), bins, keep = both(p)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(flat))
    b, kp = np.asarray(bins), np.asarray(keep)
    want = np.zeros((40, slots))
    np.add.at(want, (np.nonzero(kp)[1], b[kp]), 1)
    np.testing.assert_array_equal(np.imag(np.asarray(batched)), want)


@pytest.mark.long
@pytest.mark.parametrize(
    "shape, spec", [((2, 4), P("data", "vocab")), ((8, 1), P("data", None))]
)
def test_logits_in_row_blocks_keep_sharded_rows_in_place(shape, spec):
    """``from_logits=True`` reduces rows over blocks on the CPU; with rows
    sharded, the blocks loop per contiguous chain of rows (one per device), so
    no collective moves a row block (a single loop gathered 8.4 MB on 2 x 4
    and the whole ``[N, K]`` on 8 x 1). Values equal the one-device program."""
    n, k = 1024, 8192  # 16-row blocks: eight per chain of 128 rows
    rng = np.random.default_rng(3)
    z = jnp.asarray(rng.normal(size=(n, k)) * 4.0, jnp.float32)
    y = jnp.asarray(rng.integers(0, k, n), jnp.int32)
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
    zs = jax.device_put(z, NamedSharding(mesh, spec))
    ys = jax.device_put(y, NamedSharding(mesh, P(spec[0])))
    for name in ("ece", "nll", "brier"):
        fn = jax.jit(
            lambda a, b, name=name: metrics.METRICS[name](a, b, from_logits=True)
        )
        compiled = fn.lower(zs, ys).compile()
        sizes = [size for _, size in collectives(compiled.as_text())]
        assert max(sizes, default=0) <= 2 * n, (name, sizes)
        want = float(metrics.METRICS[name](z, y, from_logits=True))
        np.testing.assert_allclose(float(compiled(zs, ys)), want, rtol=1e-6)
