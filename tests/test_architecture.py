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
    "chunks",
    "logit_layout",
    "sharding",
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
    "calib_jax.losses._base",
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


def _cycles():
    """Every import cycle among calib_jax modules, as ``a -> b -> a`` strings:
    module-level and function-level imports alike (a function-level import
    that closes a cycle only hides it)."""
    graph = {}
    for module, imported, _, _ in _imports():
        if imported != module:
            graph.setdefault(module, set()).add(imported)
    cycles, done = set(), set()

    def visit(node, path):
        if node in path:
            ring = path[path.index(node) :]
            start = ring.index(min(ring))
            cycles.add(" -> ".join(ring[start:] + ring[:start] + [min(ring)]))
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return sorted(cycles)


# Open, to be removed with the fix: metrics/__init__.py holds the registry that
# _bootstrap and _summary read (a registry module of their own would end them);
# the search reports the _summary one by way of _streamed, which imports it.
KNOWN_CYCLES = {
    "calib_jax.metrics -> calib_jax.metrics._bootstrap -> calib_jax.metrics",
    "calib_jax.metrics -> calib_jax.metrics._streamed -> calib_jax.metrics._summary"
    " -> calib_jax.metrics",
}


def test_no_import_cycle_anywhere():
    cycles = _cycles()
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []
    assert sorted(KNOWN_CYCLES - set(cycles)) == []  # a fixed one leaves the list


# The posthoc modules a method module may import: the shared helpers, and the
# sibling method modules it builds on (each listed with its reason).
POSTHOC_SHARED = {"_base", "_core", "_cpu_kernels", "_reduction", "_validate"}
POSTHOC_METHODS = {
    "_temperature": set(),
    "_temperature_fit": {"_temperature", "_log_t_search"},  # objectives in log T
    "_ets": {"_temperature"},  # stage 1 is TS; stage 2 its NLL in log T
    "_pts": {"_temperature"},  # the NLL in log T with per-row temperatures
    "_cts": set(),
    "_matrix": set(),
    "_dirichlet": {"_matrix"},  # the [K, K] L-BFGS memory check
    "_binary": set(),
    "_histogram": set(),
    "_isotonic": set(),
    "_multilabel": set(),
    "_classwise_scaling": set(),
}


def test_each_posthoc_method_module_imports_only_the_shared_helpers():
    for name in POSTHOC_METHODS:
        assert _is_module(f"calib_jax.posthoc.{name}"), name
    taken = []
    for module, imported, _, line in _imports():
        mine, theirs = module.rpartition(".")[2], imported.rpartition(".")[2]
        if module.rpartition(".")[0] != "calib_jax.posthoc":
            continue
        if mine not in POSTHOC_METHODS or imported.rpartition(".")[0] != (
            "calib_jax.posthoc"
        ):
            continue
        if theirs not in POSTHOC_SHARED | POSTHOC_METHODS[mine] | {mine}:
            taken.append(f"{module}:{line} imports {imported}")
    assert taken == []


# Issue 21: each loss paper module keeps its equations, paper and released-code
# forms, in its own file. The private loss modules it may import besides the
# bases (_base, _validation_base): the CPU kernels' sidecar, and the shared
# confidence scores it ranks (AU_Pxτ's two modules are one paper).
LOSS_MODULE_IMPORTS = {
    "_au_pxtau": {"_au_pxtau_hist", "_confidence"},
    "_au_pxtau_hist": {"_confidence"},
    "_aurc": {"_confidence", "_cpu_kernels"},
    "_base": {"_cpu_kernels"},
    "_focal": {"_cpu_kernels"},
    "_margin": {"_cpu_kernels"},
}


def test_loss_modules_import_only_the_bases_and_their_listed_modules():
    bases = {"_base", "_validation_base"}
    taken = {}
    for module, imported, _, _ in _imports():
        package, _, mine = module.rpartition(".")
        if package != "calib_jax.losses" or not _private(mine):
            continue
        theirs = imported.rpartition(".")[2]
        if imported.startswith("calib_jax.losses.") and theirs not in bases:
            taken.setdefault(mine, set()).add(theirs)
    assert taken == LOSS_MODULE_IMPORTS
    # The sidecar of CPU kernels imports no loss module at all.
    assert "_cpu_kernels" not in taken


# Issue 21: each metrics paper module keeps its equations in its own file.
# The private metrics modules it may import: the shared pieces (_common,
# _conventions, _validate, the per-bin sums of _kernels), the CPU kernels'
# sidecar, and the modules its metric builds on.
METRIC_SHARED = {"_common", "_conventions", "_validate"}
METRIC_MODULE_IMPORTS = {
    "_adaptive": METRIC_SHARED | {"_cpu_kernels", "_inputs"},
    "_aurc": {"_common", "_cpu_kernels", "_inputs", "_validate"},
    "_binned_stats": METRIC_SHARED | {"_cpu_kernels", "_exact_sums", "_kernels"},
    "_classwise": METRIC_SHARED
    | {"_adaptive", "_binned_stats", "_ece", "_inputs", "_kernels"},
    "_common": {"_cpu_kernels"},
    "_ece": METRIC_SHARED | {"_adaptive", "_binned_stats", "_inputs", "_kernels"},
    # The input forms (logits, top-label rows) of every metric.
    "_inputs": {"_common", "_logit_rows", "_validate"},
    # The row reductions of logits (maximum, exp-sum, label logit, Brier).
    "_logit_rows": {"_common"},
    "_ood": {"_common", "_cpu_kernels", "_validate"},
    "_order_statistics": {"_conventions"},
    "_risk_coverage": {"_common", "_inputs", "_validate"},
    "_smooth": {"_common", "_inputs", "_smooth_relplot", "_validate"},
    "_smooth_relplot": {"_common"},
    # The streamed summary: the summary's own metrics, on chunks.
    "_streamed": METRIC_SHARED
    | {"_binned_stats", "_inputs", "_logit_rows", "_summary"},
    # The sidecar imports no metric paper module.
    "_cpu_kernels": {"_conventions", "_kernels", "_order_statistics"},
}


def test_metric_modules_import_only_their_listed_modules():
    taken = {}
    for module, imported, _, _ in _imports():
        package, _, mine = module.rpartition(".")
        if package != "calib_jax.metrics" or mine not in METRIC_MODULE_IMPORTS:
            continue
        if imported.startswith("calib_jax.metrics."):
            taken.setdefault(mine, set()).add(imported.rpartition(".")[2])
    assert taken == METRIC_MODULE_IMPORTS
