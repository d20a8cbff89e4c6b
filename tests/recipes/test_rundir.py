"""Run directories record the resolved config, seeds, versions and every invocation with its code."""

import json

from budgeted_attention.recipes import rundir


def test_a_resumed_run_keeps_every_invocation_with_its_own_commit(tmp_path, monkeypatch):
    commits = iter([("aaa", False), ("bbb", True)])

    def fake_environment():
        commit, dirty = next(commits)
        return {"commit": commit, "dirty": dirty, "python": "3.11"}

    monkeypatch.setattr(rundir, "environment_info", fake_environment)
    out = tmp_path / "run"
    rundir.init_run_dir(out, {"name": "x", "seeds": [0]}, [0])
    rundir.init_run_dir(out, {"name": "x", "seeds": [0]}, [0])
    info = json.loads((out / "run_info.json").read_text())
    assert [(i["commit"], i["dirty"]) for i in info["invocations"]] == [("aaa", False), ("bbb", True)]
    assert info["environment"]["commit"] == "bbb"  # the environment is the latest invocation's
    assert (out / "config.yaml").is_file()
