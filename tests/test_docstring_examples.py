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


def _examples(name):
    tests = doctest.DocTestFinder().find(importlib.import_module(name))
    return [t for t in tests if t.examples]


def test_the_public_functions_have_examples():
    # 90 docstrings with Examples today: a module that stops being found
    # (renamed, or no longer imported by walk_packages) shows up here.
    assert sum(len(_examples(m)) for m in MODULES) >= 90


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures = []
    for test in _examples(name):
        out = []
        if runner.run(test, out=out.append).failed:
            failures.append("".join(out))
    assert failures == [], "\n".join(failures)
