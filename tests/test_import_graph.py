"""The project's folders form layers, and its modules import each other without a cycle, counting
imports inside functions too (one of those hides a cycle that a change of import order would
expose)."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("keras_transformer", "training", "export", "bench", "tests")

# What each folder may import of the others. The library is the bottom layer; training and export
# stand on it; export reads training's run folder (and learns its shortlist when it has none).
MAY_IMPORT = {
    "keras_transformer": (),
    "training": ("keras_transformer",),
    "export": ("keras_transformer", "training.run_folder", "training.shortlist"),
    "bench": ("keras_transformer", "training", "export"),
    "tests": PACKAGES,
}


def _modules():
    """Module name -> path, for every module of PACKAGES (a package by its own name)."""
    modules = {}
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                    modules[module.removesuffix(".__init__")] = path
    return modules


def _imports(path, modules):
    """The modules of `modules` that the file at `path` imports, anywhere in it: `from a import
    b` counts a.b where that is a module, else a."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names)
    return found & set(modules)


def _graph():
    """Module -> the modules of PACKAGES it imports."""
    modules = _modules()
    return {module: _imports(path, modules) - {module} for module, path in modules.items()}


def _crossings(graph):
    """(module, imported) for each import of `graph` that MAY_IMPORT does not allow."""
    def allowed(module, imported):
        folder = module.split(".")[0]
        return imported.split(".")[0] == folder or any(
            imported == layer or imported.startswith(layer + ".") for layer in MAY_IMPORT[folder])

    return sorted((module, imported) for module, imports in graph.items() for imported in imports
                  if not allowed(module, imported))  # fmt: skip


def _cycle(graph):
    """A cycle of `graph` (module -> the modules it imports) as a list, or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (found := visit(imported, path + [imported])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    assert "keras_transformer.search.processors" in graph and "training.backends.jax" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # The check finds a cycle where there is one.
    assert _cycle({**graph, "keras_transformer.search.settings": graph["keras_transformer.search.settings"]
                   | {"keras_transformer.search.processing"}}) is not None  # fmt: skip


def test_each_folder_imports_only_the_layers_below_it():
    graph = _graph()
    assert _crossings(graph) == []
    assert "training.run_folder" in graph["export.saved_model"]  # (one crossing the layers allow)
    # The check sees a crossing where there is one.
    crossing = {"training.train": graph["training.train"] | {"export.signatures"},
                "keras_transformer.model": graph["keras_transformer.model"] | {"tests.artifacts"}}  # fmt: skip
    assert _crossings({**graph, **crossing}) == [("keras_transformer.model", "tests.artifacts"),
                                                 ("training.train", "export.signatures")]  # fmt: skip


def test_translating_with_an_export_imports_nothing_of_training():
    """`export.translate` needs the SavedModel alone: nothing it imports, directly or through
    another module, is of training/ (whose evaluation brings sacreBLEU)."""
    graph = _graph()
    reached, todo = set(), ["export.translate"]
    while todo:
        for imported in graph[todo.pop()] - reached:
            reached.add(imported)
            todo.append(imported)
    assert "keras_transformer.search.flags" in reached
    assert not [module for module in reached if module.split(".")[0] in ("training", "bench")], sorted(reached)
