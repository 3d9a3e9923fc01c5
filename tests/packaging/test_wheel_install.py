"""The wheel, installed (not editable) into a fresh venv, runs from any directory.

Built offline from a copy of the source tree (``pip wheel --no-deps
--no-build-isolation --no-index``), installed with ``--no-deps`` into a new
venv whose dependencies come from the test's own environment (its
site-packages appended to ``sys.path`` through a ``.pth`` file; ``.pth``
files there, such as an editable install's, are not run). The commands then
run from a directory outside the repository, with no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Local state at the top of a checkout (run outputs, environments, builds);
# below it only caches are left out: calib_jax/train/workdir.py is source.
TOP_LEVEL_IGNORED = (
    ".venv",
    ".git",
    ".whl",
    ".gl",
    ".gpu",
    "build",
    "dist",
    "runs",
    "workdir*",
)
CACHES = (".ruff_cache", ".pytest_cache", "*.egg-info", "__pycache__")


def _ignored(directory, names):
    patterns = CACHES + (TOP_LEVEL_IGNORED if Path(directory) == ROOT else ())
    return shutil.ignore_patterns(*patterns)(directory, names)


def _run(cmd, *, cwd, env, timeout=1800):
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_ignored)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            tmp / "dist",
            src,
        ],
        cwd=tmp,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("calib_jax-*.whl")
    venv = tmp / "venv"
    proc = _run([sys.executable, "-m", "venv", venv], cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    python = venv / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=tmp,
        env=env,
    ).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]  # this environment's packages
    Path(purelib, "zz_test_deps.pth").write_text(deps + "\n")
    proc = _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", wheel],
        cwd=tmp,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outside = tmp / "elsewhere"
    outside.mkdir()
    env = dict(env, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    env.pop("XLA_FLAGS", None)
    return {"wheel": wheel, "python": python, "cwd": outside, "env": env}


@pytest.mark.slow
def test_wheel_ships_the_configs_and_py_typed(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert "calib_jax/py.typed" in names
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "calib_jax").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert "calib_jax/train/workdir.py" in modules
    assert sorted(modules - set(names)) == []  # every module of the source tree
    shipped = {n.split("/")[-1] for n in names if n.startswith("calib_jax/configs/")}
    repo = {p.name for p in (ROOT / "configs").glob("*.py")}
    assert shipped == repo
    code = (
        "import calib_jax, calib_jax.configs.common as c, importlib.metadata as m, "
        "json; print(json.dumps([calib_jax.__file__, c.__file__, "
        "calib_jax.__version__, m.version('calib-jax')]))"
    )
    proc = _run([installed["python"], "-c", code], **_where(installed))
    assert proc.returncode == 0, proc.stderr[-3000:]
    package, common, version, metadata_version = json.loads(proc.stdout)
    venv = str(installed["python"].parents[1])
    assert package.startswith(venv) and common.startswith(venv)  # not the repo
    assert version == metadata_version  # one source for the version


def _where(installed):
    return {"cwd": installed["cwd"], "env": installed["env"]}


@pytest.mark.slow
@pytest.mark.parametrize("config", ["digits_ce", "configs/digits_ce.py"])
def test_train_cli_runs_from_outside_the_repository(installed, config):
    workdir = installed["cwd"] / f"run_{config.replace('/', '_')}"
    proc = _run(
        [
            installed["python"],
            "-m",
            "calib_jax.train",
            f"--config={config}:model=mlp",
            f"--workdir={workdir}",
            "--config.num_steps=4",
            "--config.log_every=2",
            "--config.shifts.corruptions=none",
            "--config.log.tensorboard=True",
        ],
        **_where(installed),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (workdir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "loss/total" in r] == [2, 4]
    assert 0.0 <= rows[-1]["test/ece"] <= 1.0
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_unknown_config_lists_the_shipped_ones_from_outside(installed):
    proc = _run(
        [installed["python"], "-m", "calib_jax.benchmark", "--config=nope"]
        + [f"--workdir={installed['cwd'] / 'b'}"],
        **_where(installed),
    )
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))
    shipped = [s for s in shipped if s not in ("__init__", "common")]
    assert line == (
        "error: unknown --config 'nope': no such file and no shipped config of "
        f"that name; shipped configs: {', '.join(shipped)}."
    )
