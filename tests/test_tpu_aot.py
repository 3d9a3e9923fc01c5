"""Ahead-of-time TPU compilation helpers (benchmarks/_tpu.py) and the v5e check.

The slow test compiles the trainer's ResNet-20 SB-ECE step for a v5e 2x2
slice. It needs libtpu (the ``tpu-aot`` extra, which ``make test-slow``
installs) and fails, rather than skips, without it.
"""

import importlib.util
import math
import sys
from pathlib import Path

import jax
import pytest

from calib_jax import data, objectives
from calib_jax.train import sharded_step
from configs import cifar10_wrn28_10

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _tpu
import tpu_aot

HLO = """\
HloModule jit_train_step
ENTRY %main.1_spmd (p: f32[8,4]) -> f32[15] {
  %p = f32[8,4]{1,0} parameter(0)
  %all-reduce.1 = (f32[15]{0:T(128)S(1)}, f32[]{:T(128)}, /*index=2*/bf16[3,3,16,32]{3,2,1,0:T(8,128)}) all-reduce(%a, %b, %c), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add, metadata={op_name="jit(train_step)/reduce_sum"}
  %gte = f32[15]{0} get-tuple-element(%all-reduce.1), index=0
  %fusion = f32[15]{0} fusion(%all-reduce.1), kind=kLoop, calls=%fused
  %all-gather = f32[512,10]{1,0} all-gather(%x), dimensions={0}, metadata={op_name="all-reduce(not this)"}
  %ag-start = (f32[4,10]{1,0}, f32[16,10]{1,0}) all-gather-start(%y), dimensions={0}
  %ag-done = f32[16,10]{1,0} all-gather-done(%ag-start)
  %cp-start = (u8[100]{0}, u8[100]{0}, u32[], u32[]) collective-permute-start(%z), source_target_pairs={{0,1}}
  %cp-done = u8[100]{0} collective-permute-done(%cp-start)
  ROOT %rs = s32[2,3]{1,0} reduce-scatter(%w), dimensions={0}, to_apply=%add
}
"""


def test_collectives_are_read_with_their_result_shapes_and_bytes():
    found = _tpu.collectives(HLO)
    assert [c.op for c in found] == [
        "all-reduce",
        "all-gather",
        "all-gather",
        "collective-permute",
        "reduce-scatter",
    ]
    reduce, gather, gather_async, permute, scatter = found
    assert reduce.shapes == (
        ("f32", (15,)),
        ("f32", ()),
        ("bf16", (3, 3, 16, 32)),
    )
    assert (reduce.elements, reduce.bytes, reduce.largest) == (
        15 + 1 + 4608,
        4 * 16 + 2 * 4608,
        4608,
    )
    assert (gather.shapes, gather.bytes) == ((("f32", (512, 10)),), 20480)
    # Async starts count their outputs, not their operands or contexts.
    assert gather_async.shapes == (("f32", (16, 10)),)
    assert (permute.shapes, permute.bytes) == ((("u8", (100,)),), 100)
    assert (scatter.elements, scatter.bytes) == (6, 24)
    assert _tpu.summarize(found) == (
        "all-reduce 1x 9.28 kB (largest array 4.61k el.); "
        "all-gather 2x 21.1 kB (largest array 5.12k el.); "
        "reduce-scatter 1x 24 B (largest array 6 el.); "
        "collective-permute 1x 100 B (largest array 100 el.)"
    )
    assert _tpu.summarize([]) == "none"


def test_roofline_memory_and_batch_arithmetic():
    v5e = _tpu.chip_of("v5e:16x16")
    assert (v5e.hbm_bytes, v5e.peak_flops, v5e.hbm_bandwidth) == (
        16 * 2**30,
        197e12,
        819e9,
    )
    assert _tpu.chip_of("v5p:2x2x1").hbm_bytes == 95 * 2**30
    assert _tpu.chip_of("v4:2x2x1").peak_flops == 275e12
    with pytest.raises(ValueError, match="Unknown TPU generation 'v9'.*v5e, v4, v5p"):
        _tpu.chip_of("v9:2x2")
    # Memory-bound: 16.38 GB at 819 GB/s is 20 ms; 1.97 TFLOP is 10 ms.
    assert _tpu.roofline_seconds(1.97e12, 16.38e9, v5e) == pytest.approx(0.020)
    # Compute-bound: 3.94 TFLOP is 20 ms; 8.19 GB is 10 ms.
    assert _tpu.roofline_seconds(3.94e12, 8.19e9, v5e) == pytest.approx(0.020)
    m = _tpu.Memory(argument=100, output=60, alias=50, temp=30, generated_code=5)
    assert m.total == 100 + 60 - 50 + 30 + 5
    a = _tpu.Analysis(m, 1.97e12, 16.38e9, [], v5e, global_batch=512)
    assert a.fits and a.step_seconds == pytest.approx(0.020)
    assert a.images_per_second == pytest.approx(512 / 0.020)
    big = _tpu.Memory(16 * 2**30, 8, 0, 0, 0)
    assert not _tpu.Analysis(big, 1.0, 1.0, [], v5e, 512).fits
    assert [_tpu.smallest_multiple(b, n) for b, n in [(128, 256), (512, 256)]] == [
        256,
        512,
    ]
    assert _tpu.smallest_multiple(500, 16) == 512


def test_missing_libtpu_is_one_line_with_the_install_command(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "libtpu" else real(name, *a),
    )
    with pytest.raises(_tpu.LibtpuMissing, match=r"pip install 'calib-jax\[tpu-aot\]'"):
        _tpu.topology_mesh("v5e:2x2")
    assert tpu_aot.main(["--no-write"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'calib-jax[tpu-aot]'" in err and "libtpu==0.0.42.*" in err


def test_own_objectives_come_from_each_configs_command():
    assert tpu_aot.own_objectives("cifar10_wrn28_10") == ("s_avuc",)
    assert tpu_aot.own_objectives("cifar100_wrn28_10") == ("sb_ece",)
    assert "cifar10_resnet110" in tpu_aot.shipped_configs()
    work = tpu_aot.training_work(
        ["cifar10_resnet110"], [], ["v5e:2x2", "v5e:16x16"], ["v5e:16x16"]
    )
    assert [(e[0], e[1], t) for e, t in work] == [
        ("cifar10_resnet110", "au_pxtau", "v5e:16x16"),
        ("cifar10_resnet110", "ce", "v5e:16x16"),
        ("cifar10_resnet110", "au_pxtau", "v5e:2x2"),
    ]
    assert [e[2].loss for e, _ in work] == [
        objectives.loss_config([{"name": "au_pxtau"}]),
        objectives.loss_config([{"name": "cross_entropy"}]),
        objectives.loss_config([{"name": "au_pxtau"}]),
    ]
    assert tpu_aot.benchmark_configs() == ["benchmark_cifar10", "benchmark_cifar100"]


def _resnet20_macs(params) -> int:
    """Forward multiply-adds of one 32x32 image: each conv's output is 32x32,
    16x16 or 8x8 for 16, 32 or 64 output channels (the CIFAR ResNet stages)."""
    side = {16: 32, 32: 16, 64: 8}
    total = 0
    for leaf in jax.tree.leaves(params):
        if leaf.ndim == 4:
            kh, kw, cin, cout = leaf.shape
            total += kh * kw * cin * cout * side[cout] ** 2
        elif leaf.ndim == 2:
            total += math.prod(leaf.shape)
    return total


@pytest.mark.slow
def test_resnet20_sb_ece_step_compiles_and_fits_on_v5e_2x2():
    # The SB-ECE paper's recipe (global batch 512) with ResNet-20.
    config = cifar10_wrn28_10.get_config("objective=sb_ece")
    config.model.name = "resnet20"
    mesh = _tpu.topology_mesh("v5e:2x2")  # LibtpuMissing without the extra
    assert mesh.devices.size == 4
    steps = sharded_step.build_sharded_step(
        config, data.dataset_info("cifar10"), mesh, num_steps=17_600
    )
    compiled = steps.train.lower(steps.abstract_state, steps.abstract_batch).compile()
    a = _tpu.analyze(compiled, _tpu.chip_of("v5e:2x2"), config.batch_size)
    assert 0 < a.memory.total <= 16 * 2**30 and a.fits
    # The donated state is aliased to the new state.
    assert a.memory.alias >= 0.9 * a.memory.output
    # Per device: 128 images, forward + two backward products, 2 FLOPs per
    # multiply-add (the stem needs no input gradient, hence a little less).
    macs = _resnet20_macs(steps.abstract_state.params)
    assert 40e6 < macs < 42e6
    expected = 2 * 3 * macs * 512 // 4
    assert 0.85 < a.flops / expected < 1.05, a.flops / expected
    assert a.bytes_accessed > 0
    # Only all-reduces: the gradients (every parameter), BatchNorm and the
    # SB-ECE bins; no gather of the batch.
    assert {c.op for c in a.collectives} == {"all-reduce"}
    reduced = {tuple(sorted(d)) for c in a.collectives for _, d in c.shapes}
    params = {
        tuple(sorted(p.shape)) for p in jax.tree.leaves(steps.abstract_state.params)
    }
    assert params <= reduced
    assert max(c.largest for c in a.collectives) == 3 * 3 * 64 * 64


def test_grid_entries_are_the_benchmark_cells_but_stage_two():
    from calib_jax.benchmark import grid

    entries = tpu_aot.grid_entries(["benchmark_cifar100"], [])
    assert [m for _, m, _ in entries] == [m for m in grid.METHODS if m != "two_stage"]
    assert {(c.dataset.name, c.model.name, c.batch_size) for *_, c in entries} == {
        ("cifar100", "wrn28_10", 512)
    }
    (interleaved,) = tpu_aot.grid_entries(
        ["benchmark_cifar100"], ["interleaved_sb_ece"]
    )
    assert interleaved[2].interleaved.enabled


def test_resume_reads_the_rows_of_its_own_section(monkeypatch, tmp_path):
    import _timing

    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## TPU ahead-of-time compile\nText.\n\n"
        f"{tpu_aot.HEADER}\n"
        "| cifar10_wrn28_10 | sb_ece | v5e:16x16 (256) | 512 | 1 | yes | 1 | 1 | 1 |\n"
        "| benchmark_cifar10 | interleaved_sb_ece (secondary step) | v5e:2x2 (4) |\n"
        "\n## TPU ahead-of-time compile: benchmark grid\n"
        "| other | ce | v5e:2x2 (4) | 512 |\n"
    )
    monkeypatch.setattr(_timing, "RESULTS", results)
    rows = tpu_aot.existing_rows(tpu_aot.SECTION)
    assert [key for key, _ in rows] == [
        ("cifar10_wrn28_10", "sb_ece", "v5e:16x16"),
        ("benchmark_cifar10", "interleaved_sb_ece", "v5e:2x2"),
    ]
    assert rows[0][1].startswith("| cifar10_wrn28_10 | sb_ece |")
    assert [k for k, _ in tpu_aot.existing_rows(tpu_aot.GRID_SECTION)] == [
        ("other", "ce", "v5e:2x2")
    ]
