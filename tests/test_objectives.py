"""calib_jax.objectives: named objectives and loss terms as config fields."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from calib_jax import losses, objectives
from calib_jax.train import validate
from configs import common, digits_soft_calibration

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("flax", "optax", "orbax", "orbax.checkpoint", "tensorflow", "grain")


def _logits_labels(n=24, k=5, seed=0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(3.0 * rng.normal(size=(n, k)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, k, n), jnp.int32)
    return logits, labels


def _value_and_grad(terms, logits, labels):
    objective = losses.composite(terms)
    return jax.jit(jax.value_and_grad(lambda z: objective(z, labels)[0]))(logits)


def test_importing_a_config_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "import configs.digits_ce, calib_jax.configs.common, calib_jax.objectives\n"
        "import configs.benchmark_digits, configs.benchmark_cifar10\n"
        "import calib_jax.configs.benchmark_cifar100\n"
        "imported = sorted(m for m in sys.modules if m.split('.')[0] in {m!r})\n"
        "from configs import digits_ce\n"
        "digits_ce.get_config()\n"
        "built = sorted(m for m in sys.modules if m.split('.')[0] in {m!r})\n"
        "print(json.dumps([imported, built]))\n"
    ).replace("{m!r}", repr({*HEAVY, "jax"}))
    env = dict(
        os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    imported, built = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == []  # not even JAX
    # Building a config reads the loss functions' defaults: JAX, nothing else.
    assert [m for m in built if m.split(".")[0] in HEAVY] == []
    assert "jax" in built


def test_every_hyperparameter_is_a_field_with_the_signature_default():
    for name, fn in losses.LOSSES.items():
        params = inspect.signature(fn).parameters
        want = {
            k: p.default
            for k, p in params.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "where"
        }
        config = objectives.loss_config([{"name": name}])
        assert config.terms == (name,)
        assert config[name].to_dict() == {"weight": 1.0, **want}, name


def test_given_values_win_and_keep_their_type():
    config = objectives.loss_config(
        [{"name": "focal", "gamma": 2, "weight": 3}, {"name": "sb_ece", "p": 1.0}]
    )
    assert config.focal.gamma == 2 and type(config.focal.gamma) is int
    assert config.focal.weight == 3.0 and type(config.focal.weight) is float
    assert config.sb_ece.p == 1.0 and config.sb_ece.temperature == 0.01


def test_term_order_and_repeated_terms_are_kept():
    terms = [{"name": "mdca"}, {"name": "focal"}, {"name": "cross_entropy"}]
    terms.append({"name": "focal", "gamma": 1.0, "weight": 0.5})
    config = objectives.loss_config(terms)
    assert config.terms == ("mdca", "focal", "cross_entropy", "focal_2")
    got = objectives.loss_terms(config)
    assert [t["name"] for t in got] == ["mdca", "focal", "cross_entropy", "focal"]
    assert got[3]["gamma"] == 1.0 and got[3]["weight"] == 0.5
    # The log keys of the objective are the config's term keys.
    _, logs = losses.composite(got)(*_logits_labels())
    assert list(logs) == ["loss/mdca", "loss/focal", "loss/cross_entropy"] + [
        "loss/focal_2",
        "loss/total",
    ]


def test_field_form_is_the_tuple_form_with_the_defaults_filled_in():
    for name, terms in objectives.OBJECTIVES.items():
        got = objectives.loss_terms(objectives.loss_config(terms))
        assert len(got) == len(terms), name
        for term, filled in zip(terms, got, strict=True):
            fn = losses.LOSSES[term["name"]]
            defaults = {
                k: p.default
                for k, p in inspect.signature(fn).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "where"
            }
            assert filled == {"weight": 1.0, **defaults, **term}, name


def _check_bit_for_bit(name):
    terms = objectives.OBJECTIVES[name]
    logits, labels = _logits_labels()
    want_v, want_g = _value_and_grad(terms, logits, labels)
    got_v, got_g = _value_and_grad(
        objectives.loss_terms(objectives.loss_config(terms)), logits, labels
    )
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_g, want_g)


@pytest.mark.parametrize("name", ["focal", "acls_released"])
def test_field_form_gives_the_tuple_forms_objective_bit_for_bit(name):
    _check_bit_for_bit(name)


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(objectives.OBJECTIVES))
def test_every_named_objective_is_bit_identical_in_field_form(name):
    _check_bit_for_bit(name)


def test_tuple_form_passes_through():
    terms = ({"name": "cross_entropy"}, {"name": "mdca", "weight": 2.0})
    assert objectives.loss_terms(terms) is terms
    c = common.base()
    c.loss = terms  # the field takes the tuple form too
    assert c.loss == terms
    c.loss = objectives.loss_config(terms)
    assert c.loss.mdca.weight == 2.0


def test_mismatched_terms_are_one_line_naming_the_field():
    config = objectives.loss_config([{"name": "cross_entropy"}, {"name": "mdca"}])
    config.terms = ("cross_entropy", "sb_ece")
    with pytest.raises(ValueError, match=r"config.loss.terms names 'sb_ece'"):
        objectives.loss_terms(config)
    config.terms = ("cross_entropy",)
    with pytest.raises(ValueError, match=r"config.loss.mdca is not in config.loss"):
        objectives.loss_terms(config)
    config.terms = ("mdca", "mdca", "cross_entropy")
    with pytest.raises(ValueError, match="lists a term twice"):
        objectives.loss_terms(config)
    with pytest.raises(ValueError, match="term #1 must be a dict with a 'name'"):
        objectives.loss_config([{"name": "cross_entropy"}, {"weight": 1.0}])


def _parse(config_file: str, *overrides: str):
    """``--config`` as the command line ``overrides`` leave it (absl parsing)."""
    argv = ["prog", f"--config={ROOT / 'configs' / config_file}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
    return values.config


def test_command_line_override_of_a_hyperparameter():
    config = _parse(
        "digits_soft_calibration.py",
        "--config.loss.sb_ece.temperature=0.005",
        "--config.loss.sb_ece.num_bins=10",
        "--config.loss.cross_entropy.weight=0.5",
    )
    terms = objectives.loss_terms(config.loss)
    want = (
        {"name": "cross_entropy", "weight": 0.5},
        {"name": "sb_ece", "weight": 1.0, "temperature": 0.005, "num_bins": 10},
    )
    logits, labels = _logits_labels()
    got_v, got_g = _value_and_grad(terms, logits, labels)
    want_v, want_g = _value_and_grad(want, logits, labels)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_g, want_g)
    # The shipped config is untouched (0.01, the loss's default).
    shipped = objectives.loss_terms(digits_soft_calibration.get_config().loss)
    assert shipped[1]["temperature"] == 0.01 and shipped[0]["weight"] == 1.0


@pytest.mark.parametrize(
    "override, message",
    [
        ("--config.loss.sb_ece.temprature=0.005", 'Did you mean "temperature"'),
        ("--config.loss.sb_ec.temperature=0.005", 'Did you mean "sb_ece"'),
    ],
)
def test_misspelt_term_or_hyperparameter_gets_a_suggestion(override, message):
    with pytest.raises((AttributeError, KeyError), match=message):
        _parse("digits_soft_calibration.py", override)


def test_override_outside_the_domain_fails_validation():
    config = _parse("digits_soft_calibration.py", "--config.loss.sb_ece.temperature=-1")
    with pytest.raises(ValueError, match="sb_ece.temperature"):
        validate(config)


def test_whole_objective_still_replaced_by_a_tuple_on_the_command_line():
    config = _parse("digits_ce.py", "--config.loss=({'name': 'focal', 'gamma': 2.0},)")
    assert config.loss == ({"name": "focal", "gamma": 2.0},)
    assert objectives.loss_terms(config.loss) == config.loss


def test_a_hyperparameter_that_defaults_to_none_takes_a_value_and_back():
    config = _parse("digits_selective.py", "--config.loss.au_pxtau.coverage=0.8")
    (term,) = objectives.loss_terms(config.loss)
    assert term["coverage"] == 0.8 and term["tau"] is None
    config = _parse(
        "digits_selective.py",
        "--config.loss.au_pxtau.coverage=0.8",
        "--config.loss.au_pxtau.coverage=None",
    )
    assert objectives.loss_terms(config.loss)[0]["coverage"] is None
