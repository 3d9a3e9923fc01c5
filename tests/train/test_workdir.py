"""calib_jax.train.workdir: one claim of a workdir for the trainer and the benchmark."""

from __future__ import annotations

import json

import pytest
from ml_collections import ConfigDict

from calib_jax import objectives
from calib_jax.benchmark import runner
from calib_jax.train import setup as setup_lib
from calib_jax.train import workdir as workdir_lib
from configs import benchmark_digits, digits_ce


def _config(**kw):
    return ConfigDict(dict(dict(seed=0, lr=0.1, log=dict(every=5)), **kw))


def test_a_new_workdir_records_the_resolved_config(tmp_path):
    path = workdir_lib.claim(_config(), tmp_path / "w", filename="run.json")
    assert path == tmp_path / "w"
    saved = (tmp_path / "w" / "run.json").read_text()
    assert json.loads(saved) == {"seed": 0, "lr": 0.1, "log": {"every": 5}}
    assert saved.endswith("\n") and saved.index('"log"') < saved.index('"seed"')


def test_the_same_config_resumes_and_resumable_keys_may_change(tmp_path):
    workdir_lib.claim(_config(), tmp_path, resumable=("log",))
    before = (tmp_path / "config.json").read_text()
    workdir_lib.claim(_config(), tmp_path)
    workdir_lib.claim(_config(log=dict(every=50)), tmp_path, resumable=("log",))
    assert (tmp_path / "config.json").read_text() == before  # never rewritten


def test_another_config_is_refused_naming_the_keys(tmp_path):
    workdir_lib.claim(_config(), tmp_path)
    with pytest.raises(
        ValueError,
        match=r"holds a run of a different config \(differs in: lr, seed\); use a "
        r"new --workdir or the same config\.$",
    ):
        workdir_lib.claim(_config(seed=1, lr=0.2), tmp_path)
    with pytest.raises(ValueError, match=r"holds results of X \(differs in: log\)"):
        workdir_lib.claim(_config(log=dict(every=6)), tmp_path, holds="results of X")


def test_check_only_writes_nothing(tmp_path):
    workdir_lib.claim(_config(), tmp_path / "w", write=False)
    assert not (tmp_path / "w").exists()


def test_a_file_is_no_workdir(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        ValueError, match=r"--workdir .*f exists and is not a directory"
    ):
        workdir_lib.claim(_config(), tmp_path / "f")


def test_a_workdir_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"^cannot create --workdir .*f/w: "):
        workdir_lib.claim(_config(), tmp_path / "f" / "w")


def test_a_run_recorded_with_the_tuple_form_resumes_under_the_field_form(tmp_path):
    terms = ({"name": "cross_entropy"}, {"name": "sb_ece", "weight": 0.5})
    old = ConfigDict({"seed": 0, "loss": objectives.loss_field(terms)})
    old.loss = terms  # as configs wrote it before loss terms were fields
    workdir_lib.claim(old, tmp_path, loss_fields=("loss",))
    new = ConfigDict({"seed": 0, "loss": objectives.loss_field(terms)})
    workdir_lib.claim(new, tmp_path, loss_fields=("loss",))  # the same terms
    # Spelling out a default is the same objective, too.
    new.loss.sb_ece.temperature = 0.01
    workdir_lib.claim(new, tmp_path, loss_fields=("loss",))
    new.loss.sb_ece.temperature = 0.005
    with pytest.raises(ValueError, match=r"differs in: loss\)"):
        workdir_lib.claim(new, tmp_path, loss_fields=("loss",))
    with pytest.raises(ValueError, match=r"differs in: loss\)"):
        workdir_lib.claim(  # without loss_fields the forms differ as written
            ConfigDict({"seed": 0, "loss": objectives.loss_field(terms)}), tmp_path
        )


def test_the_trainer_and_the_benchmark_refuse_each_others_workdir(tmp_path):
    bench, run = tmp_path / "bench", tmp_path / "run"
    runner.check_workdir(benchmark_digits.get_config("quick"), bench)
    setup_lib.check_workdir(digits_ce.get_config(), run)
    with pytest.raises(ValueError) as err:
        setup_lib.check_workdir(digits_ce.get_config(), bench)
    assert str(err.value) == (
        f"--workdir {bench} holds a benchmark's results (benchmark_config.json); "
        "use a new --workdir."
    )
    with pytest.raises(ValueError) as err:
        runner.check_workdir(benchmark_digits.get_config("quick"), run)
    assert str(err.value) == (
        f"--workdir {run} holds a training run (config.json); use a new --workdir."
    )
    assert sorted(p.name for p in bench.iterdir()) == ["benchmark_config.json"]
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]


def test_a_field_added_since_is_compared_as_its_default(tmp_path):
    # A config recorded before `new.rate` existed: it behaves as the default.
    workdir_lib.claim(_config(), tmp_path)
    added = {"new.rate": 0.0, "new": {"rate": 0.0}, "log.size": 1}
    workdir_lib.claim(
        _config(new=dict(rate=0.0), log=dict(every=5, size=1)), tmp_path, added=added
    )
    with pytest.raises(ValueError, match=r"\(differs in: log, new\)"):
        workdir_lib.claim(
            _config(new=dict(rate=0.5), log=dict(every=5, size=2)),
            tmp_path,
            added=added,
        )
    # Without the record of what was added, the missing field is a difference.
    with pytest.raises(ValueError, match=r"\(differs in: new\)"):
        workdir_lib.claim(_config(new=dict(rate=0.0)), tmp_path)


def test_a_trainer_run_recorded_before_mc_dropout_resumes(tmp_path):
    config = digits_ce.get_config()
    setup_lib.check_workdir(config, tmp_path)
    recorded = json.loads((tmp_path / "config.json").read_text())
    del recorded["mc_dropout"], recorded["model"]["dropout_rate"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    setup_lib.check_workdir(config, tmp_path)  # the defaults: the same run
    config.model.dropout_rate = 0.2
    with pytest.raises(ValueError, match=r"\(differs in: model\)"):
        setup_lib.check_workdir(config, tmp_path)
