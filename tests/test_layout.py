"""The package's import structure: no circles, and no imports that run back up the layers.

Layers, bottom to top: the core (gguf, quant, model, kv, rng, verify, cycle, drafters, schedule,
...), the GPU package (gpu/), the loop (engine), then what builds and drives it (cpu, load, web,
cli, bench). Imports inside functions count too: a lazy import is still a dependency.
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


def test_imports_do_not_run_back_up():
    graph = imports()
    above_gpu = {"pyspec.engine", "pyspec.cpu", "pyspec.load", "pyspec.web", "pyspec.cli",
                 "pyspec.bench", "pyspec.__main__"}
    for m, deps in graph.items():
        if m.startswith("pyspec.gpu"):
            assert not deps & above_gpu, f"{m} imports {deps & above_gpu}"
        if m not in ("pyspec.cli", "pyspec.__main__"):
            assert "pyspec.cli" not in deps, f"{m} imports the command line"
    assert "pyspec.gpu.backend" not in graph["pyspec.gpu.model"]
    core = ("pyspec.cycle", "pyspec.verify", "pyspec.rng", "pyspec.kv", "pyspec.model",
            "pyspec.schedule", "pyspec.drafters")
    for m in core:
        assert not {d for d in graph[m] if d.startswith("pyspec.gpu")} - {"pyspec.gpu"}, m
        assert not graph[m] & above_gpu, f"{m} imports {graph[m] & above_gpu}"
