"""baa serve reads run directories through RunDir: no serving module imports the recipes."""

import ast
from pathlib import Path

import budgeted_attention.serving as serving


def test_serving_imports_no_recipes():
    for path in sorted(Path(serving.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not [name for name in imported if name.startswith("budgeted_attention.recipes")], path
