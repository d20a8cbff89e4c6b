"""The benchmark scripts under benchmarks/ import against the current package (they are not run
by the suite: an API they use that moved would otherwise break them silently)."""

import runpy
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))  # as when the script runs: its directory is on sys.path
    namespace = runpy.run_path(str(script), run_name="imported_by_the_tests")  # module level only: main() is guarded
    assert callable(namespace.get("main"))
