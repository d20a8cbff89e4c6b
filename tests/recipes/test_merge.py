import json

import pytest

from budgeted_attention.cli import main
from budgeted_attention.errors import ConfigError
from budgeted_attention.pipeline import Experiment, load_experiment_config
from budgeted_attention.recipes.merge import run_merged
from conftest import TINY_DATA_AND_MODEL

CONFIG = f"""
name: tiny-merge
seeds: [0, 1]
methods: [dense, budgeted, budgeted-hard]
budgets: [0.5, 1.0]
{TINY_DATA_AND_MODEL}
train: {{dense_steps: 6, budgeted_steps: 6, hard_steps: 4, batch_size: 8}}
bench: {{rounds: 1, min_run_time: 0.005}}
"""


def _part(tmp_path, seed, overrides=()):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    out = tmp_path / f"part{seed}"
    Experiment(load_experiment_config(str(path), [f"seeds=[{seed}]", *overrides]), out, progress=False, log=lambda *_: None).run()
    return out


def _rows(out):
    rows = json.loads((out / "results.json").read_text())["rows"]
    return {(r["method"], r["budget"], r["seed"]): r["accuracy"] for r in rows}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parts")
    return _part(folder, 0), _part(folder, 1)


@pytest.mark.filterwarnings("ignore:skipped")
def test_merged_run_holds_every_part_and_resumes_under_its_own_config(parts, tmp_path):
    out = tmp_path / "merged"
    assert _merge(list(parts), out) == [0, 1]
    merged = _rows(out)
    assert merged == {**_rows(parts[0]), **_rows(parts[1])}  # every part's rows, as the parts measured them
    assert {seed for (_, _, seed) in merged} == {0, 1}
    info = json.loads((out / "run_info.json").read_text())
    assert info["seeds"] == [0, 1]
    assert [i.get("part") for i in info["invocations"]] == [str(parts[0]), str(parts[1]), None]  # parts, then the merge
    for seed in (0, 1):
        assert (out / "checkpoints" / f"seed{seed}" / "budgeted-hard.safetensors").is_file()
    # The merged config is a config of its own: the experiment resumes from it and trains nothing.
    cfg = load_experiment_config(str(out / "config.yaml"))
    assert cfg.seeds == [0, 1]
    Experiment(cfg, out, progress=False, log=lambda *_: None).run(finished_only=True)
    assert "PARTIAL" not in (out / "results.md").read_text()


@pytest.mark.filterwarnings("ignore:skipped")
def test_report_lists_each_parts_commands(parts, tmp_path):
    from budgeted_attention.reporting.report import load_run, run_section

    out = tmp_path / "merged"
    _merge(list(parts), out)
    section = run_section(load_run(out), figures_dir=None, out=None)
    assert "merged with `baa merge`" in section
    assert f"# part {parts[0]}" in section and f"# part {parts[1]}" in section and "# the merged run" in section


def _merge(parts, out):
    return run_merged(parts, out, progress=False, log=lambda *_: None)


@pytest.mark.filterwarnings("ignore:skipped")
def test_parts_that_cannot_be_merged_are_refused_and_nothing_is_written(parts, tmp_path):
    with pytest.raises(ConfigError, match="seed 0 is in both"):
        _merge([parts[0], parts[0]], tmp_path / "a")
    other = _part(tmp_path, 2, ["train.lr=0.01"])
    with pytest.raises(ConfigError, match="differ in more than their seeds \\(train.lr\\)"):
        _merge([parts[0], other], tmp_path / "b")
    with pytest.raises(ConfigError, match="run directory not found"):
        _merge([parts[0], tmp_path / "missing"], tmp_path / "c")
    with pytest.raises(ConfigError, match="at least two"):
        _merge([parts[0]], tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in "abcd")
    assert not list(tmp_path.glob(".*"))  # no staging directory left behind
    (tmp_path / "e").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        _merge(list(parts), tmp_path / "e")


@pytest.mark.filterwarnings("ignore:skipped")
def test_unfinished_parts_are_refused_and_a_failure_while_copying_leaves_nothing(parts, tmp_path, monkeypatch):
    import shutil

    unfinished = tmp_path / "unfinished"
    shutil.copytree(parts[1], unfinished)
    (unfinished / "units" / "seed1" / "budgeted-hard.json").unlink()
    with pytest.raises(ConfigError, match="do not hold finished runs: .*seed1/budgeted-hard"):
        _merge([parts[0], unfinished], tmp_path / "a")
    shutil.rmtree(unfinished / "checkpoints" / "seed1")
    with pytest.raises(ConfigError, match="no checkpoints/seed1"):
        _merge([parts[0], unfinished], tmp_path / "b")

    def broken_copy(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copytree", broken_copy)
    with pytest.raises(OSError, match="disk full"):
        _merge(list(parts), tmp_path / "c")
    assert not any((tmp_path / name).exists() for name in "abc")
    assert not list(tmp_path.glob(".*"))


@pytest.mark.filterwarnings("ignore:skipped")
def test_parts_may_differ_in_training_device_and_merged_runs_are_readable(parts, tmp_path):
    import shutil

    import yaml

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(parts[1], elsewhere)
    config = yaml.safe_load((elsewhere / "config.yaml").read_text())
    config["train"]["device"] = "cuda"  # trained on a GPU: not what it computed
    del config["train"]["early_stop_budgeted"]  # a part written before this key existed (at its default)
    (elsewhere / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "merged"
    assert _merge([parts[0], elsewhere], out) == [0, 1]
    (tmp_path / "plain").mkdir()
    assert (out.stat().st_mode & 0o777) == ((tmp_path / "plain").stat().st_mode & 0o777)  # a plain mkdir's, not mkdtemp's 0700
    assert str(out) not in (out / "results.md").read_text()


def test_cli_merge_errors_are_one_line(parts, tmp_path, capsys):
    code = main(["merge", str(parts[0]), str(parts[0]), "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("baa: error:") and "seed 0" in err[0]


def _copy(part, where):
    import shutil

    shutil.copytree(part, where)
    return where


@pytest.mark.filterwarnings("ignore:skipped")
def test_an_edited_config_yaml_is_refused_naming_the_part_and_both_digests(parts, tmp_path):
    import yaml

    edited = _copy(parts[1], tmp_path / "edited")
    config = yaml.safe_load((edited / "config.yaml").read_text())
    config["train"]["lr"] = 0.01  # the parts trained at another lr; config.sha256 still says so
    (edited / "config.yaml").write_text(yaml.safe_dump(config))
    stamped = (edited / "config.sha256").read_text().strip()
    with pytest.raises(ConfigError, match=f"'{edited}/config.yaml' is not the config its run was made with: its digest is [0-9a-f]{{64}}, '{edited}/config.sha256' says {stamped}"):
        _merge([parts[0], edited], tmp_path / "out")
    (edited / "config.sha256").unlink()
    with pytest.raises(ConfigError, match=f"'{edited}' is not a run directory: no config.sha256$"):
        _merge([parts[0], edited], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.filterwarnings("ignore:skipped")
def test_links_out_of_a_part_are_refused_before_copying_and_links_inside_stay_links(parts, tmp_path, capsys):
    looped = _copy(parts[1], tmp_path / "looped")
    (looped / "checkpoints" / "seed1" / "up").symlink_to("../..")  # a loop out of the part
    code = main(["merge", str(parts[0]), str(looped), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and len(err[0]) < 400, err
    assert f"'{looped}/checkpoints/seed1/up' is a symbolic link to '../..', outside '{looped / 'checkpoints' / 'seed1'}'" in err[0]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))  # nothing copied

    (looped / "checkpoints" / "seed1" / "up").unlink()
    (looped / "units" / "seed1").rename(tmp_path / "elsewhere")
    (looped / "units" / "seed1").symlink_to(tmp_path / "elsewhere")  # a seed folder kept outside the part
    with pytest.raises(ConfigError, match=f"'{looped}/units/seed1' is a symbolic link to '{tmp_path / 'elsewhere'}', outside '{looped}'"):
        _merge([parts[0], looped], tmp_path / "out")
    (looped / "units" / "seed1").unlink()
    (tmp_path / "elsewhere").rename(looped / "units" / "seed1")
    (looped / "checkpoints" / "seed1" / "alias.json").symlink_to("budgeted-hard.json")  # within the part
    (looped / "units" / "seed1" / ".dense.json.p1.abcd_123.tmp").write_text("")  # an interrupted write's
    out = tmp_path / "out"
    _merge([parts[0], looped], out)
    alias = out / "checkpoints" / "seed1" / "alias.json"
    assert alias.is_symlink() and str(alias.readlink()) == "budgeted-hard.json"
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".lock"))  # neither is an artifact


@pytest.mark.filterwarnings("ignore:skipped")
def test_staging_copies_of_killed_merges_are_removed_and_live_ones_kept(parts, tmp_path):
    import os
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".earlier.merging-p{dead.pid}-abcd_123"  # a merge SIGKILLed mid-copy
    (stale / "units").mkdir(parents=True)
    live = tmp_path / f".other.merging-p{os.getpid()}-abcd_123"  # a merge still running
    live.mkdir()
    messages = []
    run_merged(list(parts), tmp_path / "out", progress=False, log=messages.append)
    assert not stale.exists() and live.is_dir()
    assert any(str(stale) in m and "killed" in m for m in messages)
    assert not list(tmp_path.glob(".out.*"))  # its own staging copy went with the rename


@pytest.mark.filterwarnings("ignore:skipped")
def test_a_part_being_written_is_refused(parts, tmp_path):
    from budgeted_attention.runlock import RunDirLock

    with RunDirLock(parts[1]):
        with pytest.raises(ConfigError, match=f"'{parts[1]}' is being written by PID {__import__('os').getpid()}"):
            _merge(list(parts), tmp_path / "out")
    assert not (parts[1] / ".lock").exists()
