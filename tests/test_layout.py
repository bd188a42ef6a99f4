"""The package's import structure: no circles, and no imports that run back up the layers.

Layers, bottom to top, by package (LAYERS below): errors; formats and text; rules; the core
values (kv, cycle, schedule, costmodel, receipts, options, chunks, stats, request); cpu (with
its executor); drafters; gpu; engine, plan, load and testmodels; apps. Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "pyspec"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """module -> the pyspec modules it imports (a name imported from a package counts as the
    submodule when one exists by that name)."""
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("pyspec")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("pyspec"):
                    continue
                subs = {f"{target}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or {target}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_circles():
    graph = imports()
    # A package's __init__ that imports one of its submodules (even lazily, in a function)
    # while that submodule imports the __init__ is a circle too.
    def edges(m):
        return graph[m]

    done, path, cycles = set(), [], []

    def visit(m):
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        path.append(m)
        for d in sorted(edges(m)):
            visit(d)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert not cycles, f"import circles: {cycles}"


# Layers, bottom to top. A module may import its own layer and those below, never one above.
# Packages take their layer; a module listed on its own overrides its package's.
LAYERS = [
    ["pyspec", "pyspec.errors"],                         # the champion's location, the errors
    ["pyspec.formats", "pyspec.text"],                   # bytes of files, text in and out
    ["pyspec.rules"],                                    # pure rules (the JSON mask reads text.vocab)
    ["pyspec.kv", "pyspec.cycle", "pyspec.schedule", "pyspec.costmodel", "pyspec.receipts",
     "pyspec.options", "pyspec.chunks", "pyspec.stats", "pyspec.request", "pyspec.verdicts"],
    ["pyspec.cpu"],                                      # the numpy forward, the fast engine and
                                                         # the numpy executor of the cycle
    ["pyspec.drafters"],                                 # draft sources, pairing checks
    ["pyspec.gpu"],                                      # the GPU executor of the cycle
    ["pyspec.engine", "pyspec.plan", "pyspec.load", "pyspec.testmodels"],
    ["pyspec.apps", "pyspec.__main__"],                  # the front ends
]


def layer(module: str) -> int:
    """The layer of a module: its own entry, else its package's (the longest prefix listed)."""
    best, depth = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and name.count(".") > depth:
                best, depth = i, name.count(".")
    assert best is not None, f"{module} has no layer: add it to LAYERS"
    return best


def test_every_module_has_a_layer():
    for m in imports():
        layer(m)


def test_imports_do_not_run_back_up():
    graph = imports()
    for m, deps in graph.items():
        up = {d for d in deps if layer(d) > layer(m)}
        assert not up, f"{m} (layer {layer(m)}) imports a layer above it: {sorted(up)}"
    # Within the GPU package, the forward does not know the cycle built over it.
    assert "pyspec.gpu.backend" not in graph["pyspec.gpu.model"]
