"""Per-row OOD scores against float64 NumPy formulas, their identities and limits,
and their use with ``ood_auroc`` against scikit-learn."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from calib_jax import metrics

N, K, M = 40, 6, 5


def _logits(seed: int = 0) -> np.ndarray:
    """Random float32 ``[N, K]`` logits with extreme rows and ties."""
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(N, K)) * 4.0).astype(np.float32)
    z[0] = 80.0 * np.float32([1, -1, 1, -1, 0.5, -0.5])  # +-80, a tie at the max
    z[1] = -80.0  # all equal (uniform softmax)
    z[2] = np.float32([80, -80, -80, -80, -80, -80])  # probabilities ~ e^-160
    z[3] = np.float32([2, 2, 2, -1, -1, 0])  # three-way tie at the max
    z[4] = 0.0
    z[5] = np.float32([-80, -79.5, -80, -80, -80, -80])
    return z


def _members(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(M, N, K)) * 3.0).astype(np.float32)
    x[:, 0] = _logits()[0]  # extreme rows shared by every member: MI 0
    x[:, 1] = np.float32([80, -80, 0, 0, 0, 0])[None] * np.float32(
        [[1], [-1], [1], [-1], [1]]
    )  # confident members that disagree
    x[:, 2] = np.float32([80, 80, -80, -80, -80, -80])  # ties, all agree
    return x


# ---------------------------------------------------------------------------
# float64 references, straight from the formulas
# ---------------------------------------------------------------------------


def _log_softmax64(z):
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def _entropy64(log_p):
    p = np.exp(log_p)
    return -np.where(p > 0, p * log_p, 0.0).sum(axis=-1)


def ref_msp(z):
    return np.exp(_log_softmax64(z)).max(axis=-1)


def ref_max_logit(z):
    return np.asarray(z, np.float64).max(axis=-1)


def ref_energy(z, t=1.0):
    z = np.asarray(z, np.float64) / t
    m = z.max(axis=-1)
    return t * (m + np.log(np.exp(z - m[:, None]).sum(axis=-1)))


def ref_entropy_score(z):
    return -_entropy64(_log_softmax64(z))


def ref_mutual_information(members):
    log_p = _log_softmax64(members)  # [M, N, K]
    mean = np.exp(log_p).mean(axis=0)
    with np.errstate(divide="ignore"):
        total = _entropy64(np.log(mean))  # H(mean_m p_m)
    return total - _entropy64(log_p).mean(axis=0)


REFERENCES = {
    "msp": (metrics.max_softmax_score, ref_msp),
    "max_logit": (metrics.max_logit_score, ref_max_logit),
    "energy": (metrics.energy_score, ref_energy),
    "entropy": (metrics.entropy_score, ref_entropy_score),
}


def close(got, expected, rtol=1e-5, atol=1e-6):
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_score_equals_the_float64_formula(name):
    z = _logits()
    fn, ref = REFERENCES[name]
    close(fn(z), ref(z))


def test_scores_of_extreme_and_tied_rows():
    z = _logits()
    msp = np.asarray(metrics.max_softmax_score(z))
    ent = np.asarray(metrics.entropy_score(z))
    np.testing.assert_allclose(msp[[1, 4]], 1.0 / K, rtol=1e-6)
    np.testing.assert_allclose(ent[[1, 4]], -math.log(K), rtol=1e-6)
    np.testing.assert_allclose(msp[0], 0.5, rtol=1e-6)  # two-way tie at +80
    np.testing.assert_allclose(ent[0], -math.log(2), rtol=1e-6)
    np.testing.assert_allclose(msp[3], 1.0 / (3 + 2 * math.exp(-3) + math.exp(-2)))
    assert msp[2] == 1.0 and ent[2] == 0.0  # e^-160 underflows; 0 log 0 = 0
    assert np.all((msp >= 1.0 / K - 1e-7) & (msp <= 1.0))
    assert np.all((ent >= -math.log(K) - 1e-6) & (ent <= 0.0))


@pytest.mark.parametrize("temperature", [0.05, 0.5, 2.0, 10.0])
def test_energy_with_temperature_is_t_logsumexp_z_over_t(temperature):
    z = _logits()
    close(metrics.energy_score(z, temperature=temperature), ref_energy(z, temperature))


def test_energy_lies_between_max_logit_and_max_logit_plus_log_k():
    z = _logits()
    max_logit = np.asarray(metrics.max_logit_score(z), np.float64)
    energy = np.asarray(metrics.energy_score(z), np.float64)
    slack = 1e-6 * (1 + np.abs(max_logit))  # float32 rounding of max z + log(...)
    assert np.all(max_logit <= energy + slack)
    assert np.all(energy <= max_logit + math.log(K) + slack)
    # The uniform rows reach the upper bound, the e^-160 row the lower one.
    np.testing.assert_allclose(energy[[1, 4]], max_logit[[1, 4]] + math.log(K))
    assert energy[2] == max_logit[2]


def test_energy_tends_to_the_max_logit_as_t_goes_to_zero():
    z = _logits()
    max_logit = np.asarray(metrics.max_logit_score(z), np.float64)
    gaps = []
    for t in (1.0, 0.1, 1e-3):
        gap = np.asarray(metrics.energy_score(z, temperature=t), np.float64) - max_logit
        assert np.all(gap >= -1e-6 * (1 + np.abs(max_logit)))
        assert np.all(gap <= t * math.log(K) + 1e-6 * (1 + np.abs(max_logit)))
        gaps.append(gap.max())
    assert gaps[0] > gaps[1] > gaps[2]
    # No overflow of z / T: a tiny T gives the max logit (plus T log K on ties).
    np.testing.assert_allclose(
        metrics.energy_score(z, temperature=1e-30), max_logit, rtol=0, atol=2e-30
    )


def test_entropy_and_msp_are_invariant_to_a_constant_per_row():
    # Logits on a 2^-8 grid and shifts that keep them exact in float32.
    z = np.round(_logits(3)[6:] * 256) / 256
    shift = np.random.default_rng(4).integers(-64, 64, size=(z.shape[0], 1))
    shifted = (z + shift).astype(np.float32)
    np.testing.assert_allclose(
        metrics.entropy_score(shifted), metrics.entropy_score(z), atol=1e-6
    )
    np.testing.assert_allclose(
        metrics.max_softmax_score(shifted), metrics.max_softmax_score(z), rtol=1e-6
    )
    # Energy and max logit move by the shift itself.
    np.testing.assert_allclose(
        metrics.energy_score(shifted) - metrics.energy_score(z), shift[:, 0], atol=1e-4
    )


# ---------------------------------------------------------------------------
# Mutual information
# ---------------------------------------------------------------------------


def test_mutual_information_equals_the_float64_formula():
    members = _members()
    close(metrics.mutual_information(members), ref_mutual_information(members))
    close(metrics.mutual_information_score(members), -ref_mutual_information(members))


def test_mutual_information_is_zero_for_equal_members():
    z = _logits()
    members = np.broadcast_to(z, (M, N, K))
    mi = np.asarray(metrics.mutual_information(members))
    assert mi.shape == (N,)
    np.testing.assert_allclose(mi, 0.0, atol=2e-6)
    np.testing.assert_allclose(metrics.mutual_information(z[None]), 0.0, atol=2e-6)


def test_mutual_information_lies_in_zero_log_k():
    members = _members()
    mi = np.asarray(metrics.mutual_information(members))
    assert np.all(mi >= 0.0) and np.all(mi <= math.log(K) + 1e-6)
    # Two members, each certain of another class: MI = log 2 (= log M).
    two = np.zeros((2, 1, K), np.float32)
    two[0, 0, 0] = two[1, 0, 1] = 80.0
    np.testing.assert_allclose(metrics.mutual_information(two), math.log(2))
    # K members, each certain of its own class: MI reaches log K.
    eye = 80.0 * np.eye(K, dtype=np.float32)[:, None, :]
    np.testing.assert_allclose(metrics.mutual_information(eye), math.log(K))


def test_total_entropy_splits_into_expected_entropy_and_mutual_information():
    members = _members()
    log_mean = np.log(np.exp(_log_softmax64(members)).mean(axis=0)).astype(np.float32)
    expected = _entropy64(_log_softmax64(members)).mean(axis=0)
    total = -np.asarray(metrics.entropy_score(log_mean), np.float64)
    mi = np.asarray(metrics.mutual_information(members), np.float64)
    np.testing.assert_allclose(total, expected + mi, atol=1e-5)


# ---------------------------------------------------------------------------
# By name, jit, dtypes, sharding
# ---------------------------------------------------------------------------


def _direct(name, z, members):
    if name == "mutual_information":
        return metrics.mutual_information_score(members)
    return REFERENCES[name][0](z)


def test_ood_scores_names():
    assert metrics.OOD_SCORES == (
        "msp",
        "max_logit",
        "energy",
        "entropy",
        "mutual_information",
    )


@pytest.mark.parametrize("name", metrics.OOD_SCORES)
def test_ood_score_by_name_equals_the_function_and_its_jit(name):
    z, members = _logits(), _members()
    direct = np.asarray(_direct(name, z, members))
    by_name = metrics.ood_score(name, z, member_logits=members)
    np.testing.assert_array_equal(by_name, direct)
    jitted = jax.jit(lambda a, b: metrics.ood_score(name, a, member_logits=b))
    np.testing.assert_allclose(jitted(z, members), direct, rtol=1e-6, atol=1e-7)


def test_energy_temperature_is_traceable():
    z = _logits()
    temps = jnp.float32([0.5, 1.0, 4.0])
    out = jax.jit(jax.vmap(lambda t: metrics.energy_score(z, temperature=t)))(temps)
    for row, t in zip(np.asarray(out), [0.5, 1.0, 4.0]):
        close(row, ref_energy(z, t))


@pytest.mark.long
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_logits_give_float32_scores(dtype):
    z = jnp.asarray(_logits(), dtype)
    members = jnp.asarray(_members(), dtype)
    for name in metrics.OOD_SCORES:
        got = metrics.ood_score(name, z, member_logits=members)
        assert got.dtype == jnp.float32
        want = _direct(name, np.asarray(z, np.float32), np.asarray(members, np.float32))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_sharded_rows_equal_one_device():
    z, members = _logits(), _members()
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    z_sharded = jax.device_put(z, rows)
    m_sharded = jax.device_put(
        members, NamedSharding(mesh, PartitionSpec(None, "data"))
    )

    @jax.jit
    def scores(a, b):
        return metrics.energy_score(a), metrics.mutual_information(b)

    energy, mi = scores(z_sharded, m_sharded)
    np.testing.assert_allclose(energy, metrics.energy_score(z), rtol=1e-6)
    np.testing.assert_allclose(mi, metrics.mutual_information(members), atol=1e-6)


def test_empty_batch_gives_empty_scores():
    for name in metrics.OOD_SCORES:
        out = metrics.ood_score(
            name,
            np.zeros((0, K), np.float32),
            member_logits=(np.zeros((M, 0, K), np.float32)),
        )
        assert out.shape == (0,) and out.dtype == jnp.float32


# ---------------------------------------------------------------------------
# With ood_auroc, against scikit-learn
# ---------------------------------------------------------------------------


def test_max_logit_auroc_equals_sklearn_roc_auc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(5)
    # Half-integer logits: many tied max logits between and within the sets.
    z_in = np.round(rng.normal(1.0, 2.0, size=(N, K)) * 2) / 2
    z_out = np.round(rng.normal(0.0, 1.5, size=(N, K)) * 2) / 2
    s_in = metrics.max_logit_score(z_in.astype(np.float32))
    s_out = metrics.max_logit_score(z_out.astype(np.float32))
    got = float(metrics.ood_auroc(s_in, s_out))
    labels = np.r_[np.ones(len(z_in)), np.zeros(len(z_out))]
    expected = roc_auc_score(labels, np.r_[z_in.max(1), z_out.max(1)])
    assert len(np.unique(np.r_[z_in.max(1), z_out.max(1)])) < 2 * N // 3  # ties
    np.testing.assert_allclose(got, expected, rtol=1e-6)


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def test_eager_calls_reject_nan_and_inf_rows():
    z = _logits()
    z[7, 2] = np.nan
    z[9, 0] = np.inf
    with pytest.raises(ValueError, match=r"logits contains NaN or inf in 2 row\(s\) "):
        metrics.max_logit_score(z)
    members = _members()
    members[3, 11, 1] = -np.inf
    with pytest.raises(ValueError, match=r"\(first: member 3, row 11\)"):
        metrics.mutual_information(members)


def test_jitted_calls_skip_the_value_checks():
    z = _logits()
    z[7, 2] = np.nan
    out = np.asarray(jax.jit(metrics.max_softmax_score)(z))
    assert np.isnan(out[7]) and np.isfinite(np.delete(out, 7)).all()


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_energy_rejects_a_temperature_not_above_zero(temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        metrics.energy_score(_logits(), temperature=temperature)


def test_shape_and_dtype_errors():
    with pytest.raises(ValueError, match=r"logits must have shape \[N, K\]"):
        metrics.entropy_score(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"K = 1 class"):
        metrics.max_softmax_score(np.zeros((4, 1), np.float32))
    with pytest.raises(TypeError, match="logits must be floating point"):
        metrics.max_logit_score(np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError, match=r"member_logits must have shape \[M, N, K\]"):
        metrics.mutual_information(_logits())
    with pytest.raises(ValueError, match="M = 0 members"):
        metrics.mutual_information(np.zeros((0, 4, 3), np.float32))
