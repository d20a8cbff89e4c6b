"""Typed units and the method registry: the names, order and seeds of a run's units are those of
the run directories written before methods were plugins, so those directories resume."""

import json
import shutil
from pathlib import Path

import pytest

from budgeted_attention.pipeline import ALL_METHODS, METHODS, REGISTRY, Experiment, UnitId, config_from_dict, load_experiment_config, seed_indices
from budgeted_attention.pipeline.methods import plan, planned

LEGACY_RUN = Path(__file__).parents[1] / "fixtures" / "legacy" / "run"


def test_unit_names_are_the_file_names_of_older_runs():
    assert UnitId("dense", 0).name == "dense"
    assert UnitId("budgeted-hard", 0, variant="-sandwich").name == "budgeted-hard-sandwich"
    assert UnitId("bench", 0, variant="-sandwich").name == "bench-sandwich"
    assert UnitId("static", 0, budget=0.25).name == "static-b0.25"
    assert UnitId("bench-static", 0, budget=0.5).name == "bench-static-b0.5"
    assert UnitId("posthoc-recovered-1ep", 0, budget=0.75).name == "posthoc-recovered-1ep-b0.75"
    assert UnitId("ladder", 1, index=0).name == "ladder-0" and str(UnitId("bench-ladder", 1, index=2)) == "seed1/bench-ladder-2"


def test_every_method_is_registered_once_after_the_methods_it_requires():
    assert ALL_METHODS == [
        "dense", "dense-long", "budgeted", "budgeted-hard", "budgeted-sandwich", "budgeted-hard-sandwich", "budgeted-scratch",
        "static", "static-soft", "posthoc", "posthoc-recovered", "posthoc-recovered-1ep", "ladder", "budgetformer", "capped-routing",
    ]
    for position, method in enumerate(METHODS):
        assert all(METHODS.index(REGISTRY[name]) < position for name in method.requires), method.names
    assert planned(["budgeted-hard-sandwich"]) == [REGISTRY["dense"], REGISTRY["budgeted-sandwich"], REGISTRY["budgeted-hard-sandwich"]]


def test_the_plan_of_every_method_keeps_the_order_and_seed_indices_of_older_runs():
    cfg = config_from_dict({
        "seeds": [0, 1], "methods": ALL_METHODS, "budgets": [0.5, 1.0], "static_budgets": [0.5], "ladder": [{"n_layers": 1}],
    })
    units = [unit for unit in plan(cfg) if unit.id.seed == 0]
    names = [unit.id.name for unit in units]
    assert names == [
        "dense", "dense-long", "budgeted", "budgeted-hard", "bench", "budgeted-sandwich", "budgeted-hard-sandwich", "bench-sandwich",
        "budgeted-scratch", "static-b0.5", "bench-static-b0.5", "posthoc", "posthoc-recovered-b0.5", "posthoc-recovered-1ep-b0.5",
        "ladder-0", "bench-ladder-0", "budgetformer", "capped-routing", "bench-routed",
    ]
    assert {unit.id.name for unit in units if unit.timing} == {n for n in names if n.startswith("bench")}
    assert seed_indices(units)[-3:] == [14, 15, 16]  # bench-static and bench-ladder take no index


def test_a_run_directory_of_older_code_resumes_without_training(tmp_path):
    cfg_path = LEGACY_RUN / "config.yaml"
    cfg = load_experiment_config(str(cfg_path))
    if not Path(cfg.data.train_file).is_file():
        pytest.skip("the legacy run's data files are at the path of the checkout that wrote it")
    run = tmp_path / "run"
    shutil.copytree(LEGACY_RUN, run)
    records = {p.name: p.read_text() for p in (run / "units" / "seed0").glob("*.json")}
    messages = []
    with pytest.warns(UserWarning, match="malformed"):
        Experiment(cfg, run, progress=False, log=messages.append).run()
    assert "resuming: 4 of 4 units already finished" in " ".join(map(str, messages))
    assert {p.name: p.read_text() for p in (run / "units" / "seed0").glob("*.json")} == records
    written = json.loads((LEGACY_RUN / "results.json").read_text())["rows"]
    assert json.loads((run / "results.json").read_text())["rows"] == written
