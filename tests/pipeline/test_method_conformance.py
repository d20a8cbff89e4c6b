"""What every registered method of the pipeline owes the rest of it: the checklist of
docs/extending.md ("Add a method"), checked for each entry of ``METHODS``, so a new method that
misses an item fails here with the item named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from budgeted_attention.pipeline import load_experiment_config
from budgeted_attention.pipeline.methods import METHODS, REGISTRY
from budgeted_attention.pipeline.methods.base import Method
from budgeted_attention.pipeline.units import Unit
from conftest import TINY_DATA_AND_MODEL

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    path = tmp_path_factory.mktemp("conformance") / "tiny.yaml"
    path.write_text(f"name: tiny\nseeds: [0, 1]\nmethods: [dense]\nbudgets: [0.5, 1.0]\nstatic_budgets: [0.5]\n"
                    f"ladder: [{{n_layers: 1}}]\n{TINY_DATA_AND_MODEL}\n", encoding="utf-8")
    return load_experiment_config(str(path))


def _ids(method: Method) -> str:
    return method.names[0]


@pytest.mark.parametrize("method", METHODS, ids=_ids)
def test_names_are_its_own_and_config_shaped(method):
    assert method.names and all(re.fullmatch(r"[a-z][a-z0-9-]*", n) for n in method.names), method.names
    assert all(REGISTRY[name] is method for name in method.names), "a name answered by two methods"


@pytest.mark.parametrize("method", METHODS, ids=_ids)
def test_it_is_registered_after_what_it_requires(method):
    position = METHODS.index(method)
    for name in method.requires:
        assert name in REGISTRY, f"requires unknown method {name!r}"
        assert METHODS.index(REGISTRY[name]) < position, f"{name!r} must be registered before {method.names[0]!r}"


@pytest.mark.parametrize("method", METHODS, ids=_ids)
def test_its_units_are_typed_seeded_and_named_apart(method, cfg):
    for seed in cfg.seeds:
        units = method.units(cfg, seed)
        assert units and all(isinstance(u, Unit) and callable(u.work) and callable(u.collect) for u in units)
        assert all(u.id.seed == seed for u in units), "a unit of another seed"
        assert len({u.id.name for u in units}) == len(units), "two units share a record file"
    others = {u.id.name for m in METHODS if m is not method for u in m.units(cfg, 0)}
    assert not {u.id.name for u in method.units(cfg, 0)} & others, "a unit's record file is another method's"


@pytest.mark.parametrize("method", METHODS, ids=_ids)
def test_it_has_a_row_in_the_cli_references_methods_table(method):
    table = CLI_DOC.read_text(encoding="utf-8").split("### Methods", 1)[1].split("\n### ", 1)[0]
    for name in method.names:
        assert f"`{name}`" in table, f"docs/cli.md's methods table has no row naming `{name}`"
