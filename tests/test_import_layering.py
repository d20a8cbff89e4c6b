"""The package's layering, checked on the source: imports follow the data flow downwards, no
module imports itself back through others, and every import inside a function says why.

Floors, lowest first (a module may import its own floor and any floor below it)::

    0 errors, budget, io, config, runlock, rundir    plumbing
    1 data, tasks                                    data
    2 model, hf                                      models of every family
    3 pruning                                        rankings, surgery, switching
    4 training                                       stages, losses, DDP
    5 checkpoint                                     save/load of models and rankings
    6 export                                         ONNX graphs
    7 benchmark                                      timing
    8 reporting                                      tables, figures, documents
    9 pipeline                                       experiments: config, scheduler, methods
    10 serving                                       baa serve (never the recipes)
    11 recipes                                       the jobs of baa demo, bench, bench-routing, merge
    12 api, cli, the package itself                  front doors
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "src" / "budgeted_attention"

FLOORS = {
    "errors": 0, "budget": 0, "io": 0, "config": 0, "runlock": 0, "rundir": 0,
    "data": 1, "tasks": 1,
    "model": 2, "hf": 2,
    "pruning": 3,
    "training": 4,
    "checkpoint": 5,
    "export": 6,
    "benchmark": 7,
    "reporting": 8,
    "pipeline": 9,
    "serving": 10,
    "recipes": 11,
    "api": 12, "cli": 12, "": 12,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else ""]


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (annotations only, never executed)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def _imports():
    """(module, imported module, line, lazy, source line) for every executed import of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        skip = _type_checking_blocks(tree)
        lines = text.splitlines()
        module = _module_name(path)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
                if node.module == "budgeted_attention":  # `from budgeted_attention import api`: the submodules
                    targets = [
                        f"budgeted_attention.{alias.name}" for alias in node.names
                        if (PACKAGE / f"{alias.name}.py").is_file() or (PACKAGE / alias.name).is_dir()
                    ] or [node.module]
            else:
                targets = [alias.name for alias in node.names]
            for target in targets:
                yield module, target, node.lineno, node.col_offset > 0, lines[node.end_lineno - 1]


IMPORTS = list(_imports())


def test_no_import_runs_up_a_floor():
    upward = [
        f"{module}:{line} imports {target}"
        for module, target, line, _, _ in IMPORTS
        if target.startswith("budgeted_attention.") and _floor(target) > _floor(module)
    ]
    assert not upward, "imports against the data flow:\n" + "\n".join(upward)


def test_no_import_circle():
    modules = {module for module, *_ in IMPORTS}
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, target, *_ in IMPORTS:
        # `from a.b import c` may name the submodule a.b.c: resolve to the longest known module.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module and not module.startswith(target + "."):  # a package's own __init__ is not a circle
            graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"


def test_every_import_inside_a_function_says_why():
    silent = [
        f"{module}:{line}: {source.strip()}"
        for module, _, line, lazy, source in IMPORTS
        if lazy and " - " not in source.partition("#")[2]
    ]
    assert not silent, "imports inside functions need a one-line reason ('# noqa: PLC0415 - why'):\n" + "\n".join(silent)
