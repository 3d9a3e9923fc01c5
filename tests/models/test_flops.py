"""models.count_flops: hand counts, published model sizes, batch independence.

Abstract evaluation only (``jax.eval_shape`` / ``jax.make_jaxpr``): nothing is
compiled.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from calib_jax import models


class _Tiny(nn.Module):
    """Conv (SAME) -> grouped strided conv (VALID) -> dense, for a hand count."""

    @nn.compact
    def __call__(self, x, train=False):
        x = nn.relu(nn.Conv(4, (3, 3), padding="SAME")(x))  # [B, 6, 6, 4]
        x = nn.Conv(6, (2, 2), strides=2, padding="VALID", feature_group_count=2)(x)
        x = x.reshape((x.shape[0], -1))  # [B, 3 * 3 * 6]
        return nn.Dense(5)(x)


def test_tiny_model_equals_the_hand_count():
    count = models.count_flops(_Tiny(), (6, 6, 2))
    conv1 = (6 * 6 * 4) * (3 * 3 * 2)  # outputs x window x input channels
    conv2 = (3 * 3 * 6) * (2 * 2 * (4 // 2))  # 2 groups: 2 input channels each
    dense = 54 * 5
    assert (count.conv_macs, count.dense_macs) == (conv1 + conv2, dense)
    assert count.macs == conv1 + conv2 + dense
    assert count.flops == 2 * count.macs
    # relu on 144 outputs, two bias adds on 6*6*4 and 3*3*6 outputs, dense bias 5.
    assert count.elementwise == 144 + 144 + 54 + 5


def test_scan_body_counts_once_per_iteration():
    class Scanned(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            w = self.param("w", nn.initializers.ones, (x.shape[-1], x.shape[-1]))
            x, _ = jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=7)
            return x

    count = models.count_flops(Scanned(), (5,), batch=3)
    assert count.dense_macs == 7 * 5 * 5


def _resnet_cifar_macs(n, widths, stem=16, projection=False):
    """Multiply-adds of a CIFAR ResNet from its description alone.

    He et al. (2016) Sec. 4.2: a 3x3 stem conv, then 2n 3x3 convs on each of
    the 32x32, 16x16, 8x8 maps (the first of a stage strided), average pooling
    and a 10-way dense layer; Zagoruyko and Komodakis (2016) Table 1 widens the
    stages and adds 1x1 projection shortcuts where the width changes.
    """
    macs = 32 * 32 * 9 * 3 * stem
    prev = stem
    for side, width in zip((32, 16, 8), widths):
        macs += side * side * 9 * prev * width  # first conv of the stage
        macs += (2 * n - 1) * side * side * 9 * width * width
        if projection and prev != width:
            macs += side * side * prev * width
        prev = width
    return macs + prev * 10


def test_resnet20_equals_the_count_from_its_description():
    count = models.count_flops(
        models.get_model("resnet20", num_classes=10), (32, 32, 3)
    )
    assert count.macs == _resnet_cifar_macs(3, (16, 32, 64)) == 40_551_040


# Published multiply-add counts ("FLOPs" in these papers: one multiply-add each).
#   ResNet-56, ResNet-110 (CIFAR-10 baselines): 125.49M and 252.89M, M. Lin et al.,
#     "HRank: Filter Pruning using High-Rank Feature Map", CVPR 2020,
#     arXiv:2002.10179, Tables 1 and 2.
#   WRN-28-10: 5.20G (36.5M parameters); WRN-34-12 9.60G, WRN-46-14 18.6G,
#     WRN-70-16 38.8G: S. Huang et al., "Revisiting Residual Networks for
#     Adversarial Robustness: An Architectural Perspective", CVPR 2023,
#     arXiv:2212.11005, as listed in its code release's README (Table 3 and
#     the CIFAR-10 TRADES table).
PUBLISHED = [
    ("resnet56", {}, 125.49e6),
    ("resnet110", {}, 252.89e6),
    ("wrn28_10", {}, 5.20e9),
    ("wrn", dict(depth=70, width=16), 38.8e9),
]


@pytest.mark.long
@pytest.mark.parametrize(("name", "kwargs", "published"), PUBLISHED)
def test_published_counts_within_one_percent(name, kwargs, published):
    if name == "wrn":
        model = models.WideResNet(num_classes=10, **kwargs)
    else:
        model = models.get_model(name, num_classes=10)
    macs = models.count_flops(model, (32, 32, 3)).macs
    assert abs(macs / published - 1) < 0.01


def test_wrn28_10_equals_the_count_from_its_description():
    model = models.get_model("wrn28_10", num_classes=10)
    count = models.count_flops(model, (32, 32, 3))
    assert count.macs == _resnet_cifar_macs(4, (160, 320, 640), projection=True)
    # Convolutions and dense layer dominate: the rest is under 0.2% of the FLOPs.
    assert count.elementwise < 0.002 * count.flops


@pytest.mark.long
def test_counts_do_not_depend_on_the_batch_or_the_mode():
    model = models.get_model("resnet20", num_classes=10, dtype=jnp.bfloat16)
    one = models.count_flops(model, (32, 32, 3), batch=1)
    many = models.count_flops(model, (32, 32, 3), batch=6)
    assert (one.conv_macs, one.dense_macs) == (many.conv_macs, many.dense_macs)
    # Per-channel work on parameters (BatchNorm's scale) is shared by a batch.
    assert one.elementwise == pytest.approx(many.elementwise, rel=0.01)
    trained = models.count_flops(model, (32, 32, 3), batch=3, train=True)
    assert trained.macs == one.macs
    assert trained.elementwise > one.elementwise  # batch statistics


def test_train_step_is_three_forward_passes():
    model = models.get_model("resnet20", num_classes=10)
    flops = models.train_step_flops(model, (32, 32, 3), 128)
    assert flops == 3 * 2 * 40_551_040 * 128  # about 31.1 GFLOP


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [(dict(batch=0), "batch must be an integer >= 1"), (dict(batch=1.5), "batch")],
)
def test_bad_batch(kwargs, match):
    with pytest.raises(ValueError, match=match):
        models.count_flops(_Tiny(), (6, 6, 2), **kwargs)


def test_empty_input_shape():
    with pytest.raises(ValueError, match="input_shape must name at least one axis"):
        models.count_flops(_Tiny(), ())
