"""Models: registry, published sizes, features/head split, BatchNorm, bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import models
from calib_jax.models import CNN, MLP, BottleneckResNet, ResNet, WideResNet

CIFAR = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
DIGITS = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)


def _abstract_variables(model, x):
    return jax.eval_shape(model.init, jax.random.key(0), x)


def _random_variables(model, x, seed=0):
    """Variables with the shapes of ``model.init`` filled by numpy (fast).

    Compiling ``model.init`` on CPU costs seconds per model (one threefry
    kernel per parameter); the forward code under test does not depend on how
    the parameters were drawn.
    """
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = jax.tree_util.keystr(path)
        if "batch_stats" in name:
            var = "var" in name
            value = (
                rng.uniform(0.5, 1.5, leaf.shape)
                if var
                else 0.1 * rng.normal(size=leaf.shape)
            )
        elif name.endswith("['scale']"):
            value = rng.uniform(0.5, 1.5, leaf.shape)
        elif name.endswith("['kernel']"):
            fan_in = int(np.prod(leaf.shape[:-1]))
            value = rng.normal(size=leaf.shape) * np.sqrt(2.0 / fan_in)
        else:
            value = 0.1 * rng.normal(size=leaf.shape)
        return jnp.asarray(value, leaf.dtype)

    return jax.tree_util.tree_map_with_path(fill, _abstract_variables(model, x))


def _num_params(variables) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(variables["params"]))


# Published sizes for 10 classes: He et al. 2016 Table 6 (ResNet-20/32/56/110:
# 0.27M/0.46M/0.85M/1.7M); Zagoruyko & Komodakis 2016 Table 3 (WRN-28-10:
# 36.5M); ResNet-50 with the CIFAR stem: 23.5M.
PUBLISHED = {
    "resnet20": 0.27e6,
    "resnet32": 0.46e6,
    "resnet56": 0.85e6,
    "resnet110": 1.7e6,
    "preresnet56": 0.85e6,
    "resnet50": 23.5e6,
    "wrn28_10": 36.5e6,
    "wrn26_10": 36.5e6,
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    model = models.get_model(name, num_classes=10)
    variables = _abstract_variables(model, CIFAR)
    # Two significant digits, as published (e.g. ResNet-110 1,727,962 ~ 1.7M).
    assert _num_params(variables) == pytest.approx(PUBLISHED[name], rel=0.02)
    logits = jax.eval_shape(model.apply, variables, CIFAR)
    assert (logits.shape, logits.dtype) == ((2, 10), jnp.float32)
    assert "batch_stats" in variables


def test_exact_counts_and_shortcut_option():
    count = lambda m: _num_params(_abstract_variables(m, CIFAR))
    assert count(ResNet(depth=20)) == 269_722  # option A: parameter-free shortcuts
    # Option B adds two 1x1 projections + BN: 16*32 + 32*64 + 2*(32 + 64).
    assert count(ResNet(depth=20, shortcut="B")) == 269_722 + 2_560 + 192
    assert count(WideResNet(depth=28, width=10)) == 36_479_194
    assert count(BottleneckResNet()) == 23_520_842
    # The classifier is the only part that depends on K.
    assert count(ResNet(depth=20, num_classes=100)) == 269_722 + 90 * 65


def test_registry():
    assert set(models.MODELS) == {
        "mlp",
        "cnn",
        "resnet20",
        "resnet32",
        "resnet56",
        "resnet110",
        "preresnet56",
        "resnet50",
        "wrn28_10",
        "wrn26_10",
    }
    with pytest.raises(ValueError, match="Valid models: mlp, cnn, resnet20"):
        models.get_model("resnet18", num_classes=10)
    model = models.get_model("resnet20", num_classes=7, dtype="bfloat16")
    assert model.dtype == jnp.bfloat16 and model.num_classes == 7
    for name in ("mlp", "cnn"):
        model = models.get_model(name, num_classes=10)
        out = jax.eval_shape(model.apply, _abstract_variables(model, DIGITS), DIGITS)
        assert out.shape == (2, 10)


def test_bad_configs_raise():
    for bad in (ResNet(depth=9), WideResNet(depth=26, preact=True)):
        with pytest.raises(ValueError, match="depth"):
            _abstract_variables(bad, CIFAR)
    with pytest.raises(ValueError, match="shortcut"):
        _abstract_variables(ResNet(depth=8, shortcut="C"), CIFAR)


# Small members of each family on small inputs (full-size forwards are too slow
# for a 2-core CPU; the architecture code is the same).
SMALL = {
    "resnet8": (ResNet(num_classes=10, depth=8), (2, 8, 8, 3)),
    "preresnet8_b": (
        ResNet(num_classes=10, depth=8, preact=True, shortcut="B"),
        (2, 8, 8, 3),
    ),
    "wrn10_1_dropout": (
        WideResNet(num_classes=10, depth=10, width=1, dropout_rate=0.5),
        (2, 8, 8, 3),
    ),
    "wrn8_1_postact_dropout": (
        WideResNet(num_classes=10, depth=8, width=1, preact=False, dropout_rate=0.5),
        (2, 8, 8, 3),
    ),
    "bottleneck_1111": (
        BottleneckResNet(num_classes=10, stage_sizes=(1, 1, 1, 1)),
        (2, 8, 8, 3),
    ),
    "cnn": (CNN(num_classes=10), (2, 8, 8, 1)),
    "mlp": (MLP(num_classes=10, hidden=(16,)), (2, 8, 8, 1)),
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_features_head_batch_stats_dropout(name):
    model, shape = SMALL[name]
    x = jax.random.uniform(jax.random.key(1), shape)
    has_dropout = getattr(model, "dropout_rate", 0.0) > 0

    variables = _random_variables(model, x)

    @jax.jit
    def run(variables, x):
        logits = model.apply(variables, x, rngs={"dropout": jax.random.key(5)})
        h = model.apply(variables, x, train=False, method=model.features)
        from_head = model.apply(variables, h, method=model.head)

        def train(key):
            return model.apply(
                variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": key}
            )

        (train_a, updates), (train_b, _) = (
            train(jax.random.key(2)),
            train(jax.random.key(3)),
        )
        return logits, h, from_head, train_a, train_b, updates

    logits, h, from_head, train_a, train_b, updates = run(variables, x)
    assert logits.shape == (2, 10) and logits.dtype == jnp.float32
    assert h.ndim == 2 and h.shape[0] == 2 and h.dtype == jnp.float32
    np.testing.assert_allclose(from_head, logits, rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(train_a))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables["params"]))
    # Dropout acts in train mode only (eval logits above used a dropout rng too).
    assert has_dropout != np.allclose(train_a, train_b)
    if name != "mlp":
        # BatchNorm: train mode updates the running statistics.
        old = jax.tree.leaves(variables["batch_stats"])
        new = jax.tree.leaves(updates["batch_stats"])
        assert any(not np.allclose(a, b) for a, b in zip(old, new))


def test_init_and_features_by_method_name():
    model = MLP(num_classes=3, hidden=(4,))
    x = jnp.ones((2, 8, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(0), x)
    h = model.apply(variables, x, train=False, method="features")
    np.testing.assert_array_equal(h, model.apply(variables, x, method=model.features))
    np.testing.assert_array_equal(
        model.apply(variables, h, method="head"), model.apply(variables, x)
    )


@pytest.mark.parametrize(
    "model, shape",
    [
        (ResNet(num_classes=10, depth=8), (2, 8, 8, 3)),
        (CNN(num_classes=10), (2, 8, 8, 1)),
    ],
)
@pytest.mark.long
def test_bfloat16_compute(model, shape):
    low = model.clone(dtype=jnp.bfloat16)
    x = jax.random.uniform(jax.random.key(1), shape)
    v = _random_variables(low, x)
    assert jax.tree.map(lambda a: a.shape, v) == jax.tree.map(
        lambda a: a.shape, _random_variables(model, x)
    )

    @jax.jit
    def run(v, x):
        out, upd = low.apply(v, x, train=True, mutable=["batch_stats"])
        return out, upd, low.apply(v, x), model.apply(v, x)

    train_logits, updates, logits, ref_logits = run(v, x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(v["params"]))
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(updates))
    assert logits.dtype == train_logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(train_logits))
    # Same parameters in float32: bf16 keeps ~3 significant digits.
    scale = np.abs(ref_logits).max()
    np.testing.assert_allclose(logits, ref_logits, atol=0.05 * scale)
