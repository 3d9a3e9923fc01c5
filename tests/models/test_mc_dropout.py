"""MC dropout (``calib_jax.models.mc_dropout_*``) and the models' dropout option.

References: flax's own ``nn.Dropout`` (training mode, same keys) for the
samples, float64 NumPy for the predictive mean and the mutual information.
"""

from __future__ import annotations

import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from calib_jax import models
from calib_jax.train import mesh as mesh_lib

X = np.random.default_rng(0).normal(size=(6, 4, 4, 1)).astype(np.float32)
KEY = jax.random.key(7)
S = 3  # samples: one compile of the sampler for the tests that share it


@functools.cache
def _mlp(rate=0.5):
    model = models.MLP(num_classes=3, hidden=(16, 16), dropout_rate=rate)
    return model, model.init(jax.random.key(0), X)


def _row_keys(key, row, num_samples):
    return jax.random.split(jax.random.fold_in(key, row), num_samples)


class BnDropNet(nn.Module):
    """BatchNorm, dropout, dense: ``bn_inference`` forces running averages."""

    bn_inference: bool = False

    @nn.compact
    def __call__(self, x, train=False):
        x = x.reshape((x.shape[0], -1))
        use_avg = (not train) or self.bn_inference
        x = nn.BatchNorm(use_running_average=use_avg, name="bn")(x)
        x = nn.Dropout(0.4, deterministic=not train, name="drop")(x)
        return nn.Dense(5, name="dense")(x)


# ---- the dropout option of the digits models ----------------------------------------


@pytest.mark.long
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_rate_zero_adds_no_layer_and_rate_changes_no_parameter(name):
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 4, 1)), jnp.float32)
    small = {"hidden": (8, 8)} if name == "mlp" else {"widths": (4,), "hidden": 8}
    plain = models.get_model(name, num_classes=4, **small)
    zero = models.get_model(name, num_classes=4, dropout_rate=0.0, **small)
    drop = models.get_model(name, num_classes=4, dropout_rate=0.3, **small)
    v = plain.init(jax.random.key(0), x)
    # Same variable trees: dropout has no parameter or statistic.
    for other in (zero, drop):
        other_v = jax.eval_shape(other.init, jax.random.key(0), x)
        assert jax.tree.structure(other_v) == jax.tree.structure(v)
    assert models.count_dropout_layers(zero, x) == 0
    assert models.count_dropout_layers(drop, x) == (2 if name == "mlp" else 1)
    # Inference outputs are the model's without the option; rate 0 also in
    # training mode, where it needs no dropout rng (no layer exists).
    ref = plain.apply(v, x)
    np.testing.assert_array_equal(drop.apply(v, x), ref)
    mutable = ["batch_stats"] if "batch_stats" in v else False
    np.testing.assert_array_equal(
        jax.tree.leaves(zero.apply(v, x, train=True, mutable=mutable))[0],
        jax.tree.leaves(plain.apply(v, x, train=True, mutable=mutable))[0],
    )


def test_mlp_trains_with_dropout_and_needs_the_dropout_rng():
    model, v = _mlp(0.5)
    a = model.apply(v, X, train=True, rngs={"dropout": jax.random.key(1)})
    b = model.apply(v, X, train=True, rngs={"dropout": jax.random.key(2)})
    assert not np.array_equal(a, b)
    with pytest.raises(flax.errors.InvalidRngError):
        model.apply(v, X, train=True)


def test_from_config_takes_dropout_rate_and_rejects_models_without_it():
    from ml_collections import ConfigDict

    def cfg(name, rate, **kwargs):
        fields = {"name": name, "dtype": "float32", "dropout_rate": rate}
        return ConfigDict(dict(fields, kwargs=kwargs))

    assert models.from_config(cfg("mlp", 0.2), num_classes=3).dropout_rate == 0.2
    assert models.from_config(cfg("cnn", 0.0), num_classes=3).dropout_rate == 0.0
    with pytest.raises(ValueError, match=r"model 'resnet20' has no dropout; models"):
        models.from_config(cfg("resnet20", 0.2), num_classes=3)
    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\)"):
        models.from_config(cfg("mlp", 1.0), num_classes=3)
    with pytest.raises(
        ValueError, match="contradicts config.model.kwargs.dropout_rate"
    ):
        models.from_config(cfg("wrn28_10", 0.3, dropout_rate=0.1), num_classes=3)
    assert set(models.DROPOUT_MODELS) == {"mlp", "cnn", "wrn28_10", "wrn26_10"}


# ---- samples ----------------------------------------------------------------------------


@pytest.mark.long
def test_samples_are_flax_dropout_with_the_documented_keys():
    model, v = _mlp()
    z = models.mc_dropout_logits(model, v, X, key=KEY, num_samples=S, first_row=5)
    assert z.shape == (S, 6, 3) and z.dtype == jnp.float32
    for i, s in ((0, 0), (2, 1), (5, 2)):
        key = _row_keys(KEY, 5 + i, S)[s]
        ref = model.apply(v, X[i : i + 1], train=True, rngs={"dropout": key})
        np.testing.assert_allclose(z[s, i], ref[0], rtol=1e-6, atol=1e-6)


@pytest.mark.long
def test_batchnorm_stays_on_running_averages_while_dropout_samples():
    x = jnp.asarray(X)
    v = BnDropNet().init(jax.random.key(0), x)
    rng = np.random.default_rng(2)
    stats = v["batch_stats"]["bn"]
    v = {
        "params": v["params"],
        "batch_stats": {
            "bn": {
                "mean": jnp.asarray(rng.normal(size=stats["mean"].shape), jnp.float32),
                "var": jnp.asarray(
                    rng.uniform(0.5, 2, stats["var"].shape), jnp.float32
                ),
            }
        },
    }
    z = models.mc_dropout_logits(BnDropNet(), v, x, key=KEY, num_samples=2)
    reference = BnDropNet(bn_inference=True)
    for i, s in ((0, 1), (3, 0), (5, 1)):
        key = _row_keys(KEY, i, 2)[s]
        ref = reference.apply(v, x[i : i + 1], train=True, rngs={"dropout": key})
        np.testing.assert_allclose(z[s, i], ref[0], rtol=1e-6, atol=1e-6)
    # Not the batch statistics of training mode:
    train_mode = BnDropNet().apply(
        v, x, train=True, rngs={"dropout": KEY}, mutable=["batch_stats"]
    )[0]
    assert not np.allclose(train_mode, z[0], atol=1e-3)


def test_samples_differ_and_are_deterministic_per_key():
    model, v = _mlp()
    a = models.mc_dropout_logits(model, v, X, key=KEY, num_samples=S)
    b = models.mc_dropout_logits(model, v, X, key=KEY, num_samples=S)
    c = models.mc_dropout_logits(model, v, X, key=jax.random.key(8), num_samples=S)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    for s in range(1, S):
        assert not np.allclose(a[0], a[s])
    # Dropout off (inference): the deterministic logits differ from every sample.
    assert not np.allclose(model.apply(v, X), a[0])


@pytest.mark.long
def test_samples_do_not_depend_on_the_batch_split_or_the_jit_site():
    # The same masks; another batch shape may round differently.
    model, v = _mlp()
    whole = models.mc_dropout_logits(model, v, X, key=KEY, num_samples=S)
    part = models.mc_dropout_logits(
        model, v, X[2:], key=KEY, num_samples=S, first_row=2
    )
    np.testing.assert_allclose(part, whole[:, 2:], rtol=1e-5, atol=1e-6)
    jitted = jax.jit(
        lambda v, x, r: models.mc_dropout_logits(
            model, v, x, key=KEY, num_samples=S, first_row=r
        )
    )
    np.testing.assert_allclose(jitted(v, X[2:], 2), part, rtol=1e-5, atol=1e-6)


@pytest.mark.long
def test_row_sharded_over_8_devices_equals_one_device():
    model, v = _mlp()
    x = np.random.default_rng(3).normal(size=(16, 4, 4, 1)).astype(np.float32)
    mesh = mesh_lib.data_mesh()
    assert mesh.size == 8
    rows = NamedSharding(mesh, P(mesh_lib.AXIS))
    fn = jax.jit(
        lambda v, x: models.mc_dropout_predict(model, v, x, key=KEY, num_samples=S),
        in_shardings=(NamedSharding(mesh, P()), rows),
        out_shardings=rows,
    )
    sharded = fn(v, jax.device_put(x, rows))
    single = models.mc_dropout_predict(model, v, x, key=KEY, num_samples=S)
    np.testing.assert_allclose(sharded.logits, single.logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        sharded.mutual_information, single.mutual_information, rtol=1e-5, atol=1e-6
    )


def test_model_without_dropout_is_a_one_line_error_also_under_jit():
    model, v = _mlp(0.0)
    for call in (
        lambda: models.mc_dropout_logits(model, v, X, key=KEY, num_samples=4),
        lambda: jax.jit(
            lambda v: models.mc_dropout_predict(model, v, X, key=KEY, num_samples=4)
        )(v),
    ):
        with pytest.raises(ValueError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text
        assert "mc_dropout num_samples=4 needs a model with dropout" in text
        assert "MLP (dropout_rate=0.0) has no dropout layer" in text
        assert "calib_jax.models.DROPOUT_MODELS lists the models" in text


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_num_samples_must_be_a_positive_int(bad):
    model, v = _mlp()
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        models.mc_dropout_logits(model, v, X, key=KEY, num_samples=bad)


def test_one_sample_is_that_sample():
    model, v = _mlp()
    z = models.mc_dropout_logits(model, v, X, key=KEY, num_samples=1)
    out = models.mc_dropout_predict(model, v, X, key=KEY, num_samples=1)
    np.testing.assert_allclose(
        jax.nn.softmax(out.logits), jax.nn.softmax(z[0]), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(out.mutual_information, 0.0, atol=1e-6)


# ---- the average and the mutual information -------------------------------------------


def _reference(z: np.ndarray):
    z = z.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mean = p.mean(0)

    def h(q):
        return -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), -1)

    return mean, h(mean) - h(p).mean(0)


def test_average_equals_a_float64_reference():
    rng = np.random.default_rng(4)
    z = (rng.normal(size=(5, 40, 7)) * rng.uniform(0.1, 8, size=(1, 40, 1))).astype(
        np.float32
    )
    z[:, 0] = z[0, 0]  # samples that agree: MI = 0
    out = models.mc_dropout_average(z)
    mean, mi = _reference(z)
    assert (
        out.logits.dtype == jnp.float32 and out.mutual_information.dtype == jnp.float32
    )
    np.testing.assert_allclose(np.exp(out.logits), mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(jax.nn.softmax(out.logits), mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.mutual_information, mi, rtol=1e-4, atol=2e-6)
    assert np.all(np.asarray(out.mutual_information) >= 0)
    assert out.mutual_information[0] <= 1e-6
    # Bounded by log K and by log S.
    assert np.all(np.asarray(out.mutual_information) <= np.log(5) + 1e-5)
    # jit equals eager; bf16 in, float32 out.
    jitted = jax.jit(models.mc_dropout_average)(z)
    np.testing.assert_array_equal(jitted.logits, out.logits)
    half = models.mc_dropout_average(jnp.asarray(z, jnp.bfloat16))
    assert half.logits.dtype == jnp.float32


def test_average_matches_metrics_mutual_information():
    from calib_jax import metrics

    z = np.random.default_rng(5).normal(size=(4, 12, 3)).astype(np.float32) * 3
    np.testing.assert_allclose(
        models.mc_dropout_average(z).mutual_information,
        metrics.mutual_information(z),
        rtol=1e-5,
        atol=1e-6,
    )


def test_average_rejects_a_wrong_rank():
    with pytest.raises(ValueError, match=r"sample_logits must be \[S, N, K\]"):
        models.mc_dropout_average(np.zeros((4, 3), np.float32))
