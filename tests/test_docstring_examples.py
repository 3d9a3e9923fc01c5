"""The Examples sections of the library's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import calib_jax

# Command lines define absl flags at import; configs are data.
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(calib_jax.__path__, "calib_jax.")
    if not m.name.endswith("__main__") and not m.name.startswith("calib_jax.configs")
)


# Modules whose examples fit and compile several calibrators: 30-48 s each of
# make test beside 4 busy processes on 2 cores (make test-load). They run in
# make test-slow with the other `long` tests.
LONG = {
    "calib_jax.conformal._registry",
    "calib_jax.posthoc._binary",
    "calib_jax.posthoc._cts",
    "calib_jax.posthoc._ets",
    "calib_jax.posthoc._histogram",
}


def _examples(name):
    tests = doctest.DocTestFinder().find(importlib.import_module(name))
    return [t for t in tests if t.examples]


def test_the_long_modules_exist():
    assert LONG <= set(MODULES)


def test_the_public_functions_have_examples():
    # 90 docstrings with Examples today: a module that stops being found
    # (renamed, or no longer imported by walk_packages) shows up here.
    assert sum(len(_examples(m)) for m in MODULES) >= 90


@pytest.mark.parametrize(
    "name",
    [pytest.param(m, marks=pytest.mark.long) if m in LONG else m for m in MODULES],
)
@pytest.mark.long
def test_docstring_examples(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures = []
    for test in _examples(name):
        out = []
        if runner.run(test, out=out.append).failed:
            failures.append("".join(out))
    assert failures == [], "\n".join(failures)
