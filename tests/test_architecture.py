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


def _imports():
    """``(module, imported module, name or None, line)`` of every import."""
    for module, path, is_package in _modules():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("calib_jax"):
                        yield module, a.name, None, node.lineno
                        if a.asname:
                            aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_package, node)
                if not source.startswith("calib_jax"):
                    continue
                for a in node.names:
                    full = f"{source}.{a.name}"
                    if _is_module(full):
                        yield module, full, None, node.lineno
                        aliases[a.asname or a.name] = full
                    else:
                        yield module, source, a.name, node.lineno
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
