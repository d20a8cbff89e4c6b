"""RunDir: every artifact path of a run directory, its lookups, its stamp and its checks."""

import json
import os
from pathlib import Path

import pytest

from budgeted_attention import rundir
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.rundir import RunDir, RunDirError

LEGACY = Path(__file__).parent / "fixtures" / "legacy" / "run"


def test_paths_are_the_names_old_code_wrote():
    run = RunDir(LEGACY)
    for path in (run.config, run.config_digest, run.run_info, run.tokenizer, run.labels, run.lengths, run.summary,
                 run.results_json, run.results_csv, run.results_md, run.bench_json, run.bench_md):
        assert path.is_file(), path
    assert run.unit(0, "dense").is_file()
    assert run.checkpoint_description(0, "budgeted-hard").is_file()
    assert run.checkpoint(0, "dense").with_suffix(".safetensors").is_file()
    assert run.seed_dirs(0) == (LEGACY / "units" / "seed0", LEGACY / "checkpoints" / "seed0")
    assert run.seeds() == [0]
    assert run.benches() == [run.bench_json]
    assert [p.name for p in run.unit_records()] == ["bench.json", "budgeted-hard.json", "budgeted.json", "dense.json"]
    assert run.onnx_dir == LEGACY / "onnx" and run.lock == LEGACY / ".lock"
    assert run.serve_load.name == "serve_load.json" and run.serve_soak.name == "serve_soak.json"
    assert run.routing_bench_json.name == "routing_bench.json" and run.routed_md.name == "routed.md"
    assert RunDir.tokenizer.name == "tokenizer.json" and RunDir.DATA_FILES == ("tokenizer.json", "labels.json", "lengths.json")


def test_seeds_come_from_units_and_checkpoints_folders(tmp_path):
    run = RunDir(tmp_path)
    assert run.seeds() == []
    run.unit_dir(3).mkdir(parents=True)
    run.checkpoint_dir(1).mkdir(parents=True)
    (run.checkpoints_dir / "seedling").mkdir()
    (run.units_dir / "seed7").write_text("not a folder")
    assert run.seeds() == [1, 3]


def test_find_checkpoint_takes_the_first_seed_or_the_given_one(tmp_path):
    run = RunDir(tmp_path)
    for seed in (2, 0):
        run.checkpoint_dir(seed).mkdir(parents=True)
        run.checkpoint_description(seed, "budgeted-hard").write_text("{}")
    assert run.find_checkpoint() == run.checkpoint_description(0, "budgeted-hard")
    assert run.find_checkpoint(2) == run.checkpoint_description(2, "budgeted-hard")
    with pytest.raises(CheckpointError, match=r"no budgeted-hard checkpoint for seed 5 in '.*checkpoints' \(run 'baa experiment --out "):
        run.find_checkpoint(5, command="baa experiment")
    with pytest.raises(CheckpointError, match="no dense checkpoint in"):
        run.find_checkpoint(name="dense")


def test_locate_takes_a_run_directory_or_a_checkpoint_file(tmp_path):
    folder, checkpoint = RunDir.locate(LEGACY)
    assert folder == RunDir(LEGACY) and checkpoint == RunDir(LEGACY).checkpoint_description(0, "budgeted-hard")
    folder, same = RunDir.locate(checkpoint)
    assert same == checkpoint and folder.path == checkpoint.parent  # a loose checkpoint's files lie beside it
    with pytest.raises(RunDirError, match=f"run directory not found: '{tmp_path / 'missing'}'"):
        RunDir.locate(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunDirError, match="not a run directory: .* is a file"):
        RunDir.locate(tmp_path / "file.txt")


def test_of_checkpoint_is_the_run_the_checkpoint_lies_in(tmp_path):
    assert RunDir.of_checkpoint(LEGACY / "checkpoints" / "seed0" / "dense.json") == RunDir(LEGACY)
    assert RunDir.of_checkpoint(tmp_path / "loose.safetensors") == RunDir(tmp_path)


def test_open_names_the_path_and_what_is_missing(tmp_path):
    assert RunDir.open(LEGACY).path == LEGACY
    with pytest.raises(RunDirError, match=f"^'{tmp_path}' is not a run directory: no config.yaml$"):
        RunDir.open(tmp_path)
    with pytest.raises(RunDirError, match=r"no results.json or run_info.json \(run it first\)$"):
        RunDir.open(tmp_path, require=(RunDir.results_json, RunDir.run_info), hint="run it first")
    assert issubclass(RunDirError, ConfigError)  # exit code 2 in the CLI, like every bad input


def test_create_keeps_every_invocation_with_its_own_commit(tmp_path, monkeypatch):
    commits = iter([("aaa", False), ("bbb", True)])

    def fake_environment():
        commit, dirty = next(commits)
        return {"commit": commit, "dirty": dirty, "python": "3.11"}

    monkeypatch.setattr(rundir, "environment_info", fake_environment)
    out = tmp_path / "run"
    RunDir.create(out, {"name": "x", "seeds": [0]}, [0])
    run = RunDir.create(out, {"name": "x", "seeds": [0]}, [0])
    info = json.loads(run.run_info.read_text())
    assert [(i["commit"], i["dirty"]) for i in info["invocations"]] == [("aaa", False), ("bbb", True)]
    assert info["environment"]["commit"] == "bbb"  # the environment is the latest invocation's
    assert info["seeds"] == [0] and RunDir.open(out) == run


def test_a_benchmark_script_knows_what_it_measured_already(tmp_path):
    """benchmarks/*.py skip a run directory that holds their measurement with the same arguments
    (``make study-NAME`` resumes), and refuse one of other arguments or of no recorded command."""
    out = RunDir(tmp_path / "bench")
    assert not out.measured_by("benchmarks/x.py", ["run", "--out", str(out.path)])  # nothing there yet
    out.path.mkdir()
    out.results_json.write_text(json.dumps({"rows": []}))
    with pytest.raises(RunDirError, match="no recorded command"):
        out.measured_by("benchmarks/x.py", ["run"])
    out.run_info.write_text(json.dumps({"command": ["python", "benchmarks/x.py", "run", "--seed", "1"]}))
    assert out.measured_by("benchmarks/x.py", ["run", "--seed", "1"])
    assert out.measured_by("benchmarks/x.py", ["run", "--seed", "1", "--force"])  # --force is no other measurement
    with pytest.raises(RunDirError, match=r"other arguments \(run --seed 1\): benchmarks/x.py --force measures anew"):
        out.measured_by("benchmarks/x.py", ["run", "--seed", "2"])
    out.run_info.write_text(json.dumps({"invocations": [{"command": ["python", "benchmarks/x.py", "run"]}]}))  # serve_load's record
    assert out.measured_by("benchmarks/x.py", ["run"])
    with pytest.raises(RunDirError, match="holds a measurement of benchmarks/x.py, not benchmarks/y.py"):
        out.measured_by("benchmarks/y.py", ["run"])
    source = RunDir(tmp_path / "source")
    source.path.mkdir()
    source.results_json.write_text("{}")
    os.utime(out.run_info, (1, 1))  # measured long before the source's results
    with pytest.raises(RunDirError, match="was measured before .*source' changed"):
        out.measured_by("benchmarks/x.py", ["run"], sources=(source.path,))
    out.run_info.write_text("[not an object")
    with pytest.raises(RunDirError, match="no recorded command"):
        out.measured_by("benchmarks/x.py", ["run"])
