"""``--config`` takes a path or the name of a config shipped in the package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calib_jax.train import cli

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_configs_are_the_configs_directory():
    shipped = cli.shipped_configs()
    expected = sorted(
        p.stem
        for p in (ROOT / "configs").glob("*.py")
        if p.stem not in ("__init__", "common")
    )
    assert sorted(shipped) == expected
    assert "digits_ce" in shipped and "benchmark_digits" in shipped
    for name, path in shipped.items():
        assert os.path.samefile(path, ROOT / "configs" / f"{name}.py")


@pytest.mark.parametrize(
    "value",
    ["digits_ce", "digits_ce.py", "configs/digits_ce.py", "./configs/digits_ce"],
)
def test_names_resolve_to_the_shipped_file_from_any_directory(
    tmp_path, monkeypatch, value
):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    path, sep, arg = cli.resolve_config(value + ":model=cnn").partition(":")
    assert os.path.samefile(path, ROOT / "configs" / "digits_ce.py")
    assert (sep, arg) == (":", "model=cnn")


def test_an_existing_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    own = tmp_path / "configs" / "digits_ce.py"
    own.write_text("def get_config():\n    return None\n")
    assert cli.resolve_config("configs/digits_ce.py") == "configs/digits_ce.py"
    assert cli.resolve_config(str(own) + ":x") == str(own) + ":x"


@pytest.mark.parametrize("value", ["nope", "elsewhere/digits_ce.py", "digits_ce.txt"])
def test_unknown_config_lists_the_shipped_ones_in_one_line(
    tmp_path, monkeypatch, value
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        cli.resolve_config(value)
    text = str(err.value)
    assert "\n" not in text
    assert f"unknown --config '{value}'" in text
    listed = text.split("shipped configs: ", 1)[1].rstrip(".").split(", ")
    assert listed == list(cli.shipped_configs())


def test_only_the_config_flag_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["prog", "--config", "digits_ce", "--config.num_steps=2", "--", "x"]
    out = cli._with_resolved_config(argv)
    assert os.path.samefile(out[2], ROOT / "configs" / "digits_ce.py")
    assert out[:2] == argv[:2] and out[3:] == argv[3:]
    out = cli._with_resolved_config(["prog", "--config=benchmark_digits:quick"])
    path = out[1].split("=", 1)[1].partition(":")[0]
    assert os.path.samefile(path, ROOT / "configs" / "benchmark_digits.py")
    assert out[1].endswith(":quick")
