"""The import rules of docs/architecture.md, read from every module's source."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "calib_jax"

# docs/architecture.md's table, top to bottom: a module imports only modules
# listed before it (its own package aside).
LAYERS = (
    "_checks",
    "_memory",
    "_cli",
    "kernels",
    "storage",
    "progress",
    "losses",
    "metrics",
    "models",
    "data",
    "posthoc",
    "conformal",
    "plots",
    "tensorboard",
    "objectives",
    "train",
    "evaluate",
    "benchmark",
    "configs",
)

# The modules whose underscore names other modules may import.
BASES = {
    "calib_jax._checks",
    "calib_jax.losses._validation_base",
    "calib_jax.losses._kernel_base",
}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path, rel.name == "__init__"


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "calib_jax" else None


def _targets(module: str, is_package: bool, node):
    """``(imported module, name or None, local alias or None)`` of each
    calib_jax target of one import statement (nothing for other nodes)."""
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.startswith("calib_jax"):
                yield a.name, None, a.asname
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, is_package, node)
        if source.startswith("calib_jax"):
            for a in node.names:
                full = f"{source}.{a.name}"
                if _is_module(full):
                    yield full, None, a.asname or a.name
                else:
                    yield source, a.name, None


def _imports():
    """``(module, imported module, name or None, line)`` of every import."""
    for module, path, is_package in _modules():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> module it is bound to
        for node in ast.walk(tree):
            for imported, name, local in _targets(module, is_package, node):
                yield module, imported, name, node.lineno
                if local:
                    aliases[local] = imported
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                yield module, aliases[node.value.id], node.attr, node.lineno


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_layers_name_every_package_and_module():
    top = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    top -= {"__init__", "__pycache__"}
    assert top == set(LAYERS)


def test_no_module_imports_a_package_listed_after_its_own():
    upward = []
    for module, imported, _, line in _imports():
        mine, theirs = _layer(module), _layer(imported)
        if mine is None or theirs is None or mine == theirs:
            continue
        if LAYERS.index(theirs) > LAYERS.index(mine):
            upward.append(f"{module}:{line} imports {imported}")
    assert upward == []


def test_no_module_takes_an_underscore_name_from_another_but_the_bases():
    taken = []
    for module, imported, name, line in _imports():
        if name is None or not _private(name) or imported == module:
            continue
        if imported in BASES:
            continue
        taken.append(f"{module}:{line} takes {imported}.{name}")
    assert taken == []


def test_the_base_modules_exist_and_the_page_names_them():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for base in BASES:
        assert _is_module(base), base
        assert base.replace(".", "/") + ".py" in page, base


def _package(module: str) -> str:
    """The package a private module belongs to: the name before its first
    underscore component (``calib_jax.posthoc._validate`` ->
    ``calib_jax.posthoc``), or None for a public module."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_a_private_module_of_another_package():
    taken = []
    for module, imported, _, line in _imports():
        owner = _package(imported)
        if owner is None or imported in BASES:
            continue
        if module != owner and not module.startswith(owner + "."):
            taken.append(f"{module}:{line} imports {imported}")
    assert taken == []


# Imports of calib_jax inside a function, each with its reason; every other
# import of the package goes at the top of its file.
LAZY = {
    # Command lines: the heavy modules load after absl has parsed the flags,
    # so a wrong flag fails at once.
    ("calib_jax.benchmark.__main__", "calib_jax.benchmark.runner"),
    ("calib_jax.evaluate.__main__", "calib_jax.evaluate._run"),
    ("calib_jax.train.__main__", "calib_jax.train.loop"),
    # ... and the model's options named when a --config.model.kwargs.x fails.
    ("calib_jax.train.cli", "calib_jax.models"),
    # Configs import these modules: they must not pull in JAX.
    ("calib_jax.objectives", "calib_jax.losses"),
    ("calib_jax.benchmark.grid", "calib_jax.posthoc"),
    # Import cycles: the package's __init__ imports the module.
    ("calib_jax.metrics._bootstrap", "calib_jax.metrics"),
    ("calib_jax.posthoc._calibrator", "calib_jax.posthoc._persist"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._calibrator"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._binary"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._cts"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._dirichlet"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._ets"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._histogram"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._isotonic"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._matrix"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._pts"),
    ("calib_jax.posthoc._persist", "calib_jax.posthoc._temperature"),
}


def _function_imports():
    """``(module, imported module, line)`` of calib_jax imports in functions."""
    for module, path, is_package in _modules():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    for imported, _, _ in _targets(module, is_package, node):
                        yield module, imported, node.lineno


def test_package_imports_are_at_the_top_but_the_listed_lazy_ones():
    inside = {(m, i) for m, i, _ in _function_imports()}
    extra = sorted(
        f"{m}:{line} imports {i}"
        for m, i, line in _function_imports()
        if (m, i) not in LAZY
    )
    assert extra == []
    assert sorted(LAZY - inside) == []  # an entry whose import moved goes too
