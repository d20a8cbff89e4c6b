"""`baa report`: a results document written from run directories, never pasted."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from budgeted_attention.cli import main  # noqa: E402
from budgeted_attention.reporting.report import build_report, render_command, write_report  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _env(**extra):
    env = {"python": "3.11.7", "platform": "Linux-x86_64", "processor": "x86_64", "cpu_count": 2,
           "packages": {"torch": "2.13.0+cpu", "budgeted_attention": "0.1.0"}}
    env.update(extra)
    return env


def _png(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, format="png", dpi=20)
    plt.close(fig)


def _soft(budget, cost, test, val, seed):
    return {"method": "budgeted", "budget": budget, "seed": seed, "accuracy": test, "val_accuracy": val,
            "cost": cost, "cost_kind": "soft-estimate", "steps": 3000}


def make_experiment_run(root: Path) -> Path:
    """A new-style experiment run: name in config, resumed twice, units with seconds, bench with transformers_speedup."""
    run = root / "runs" / "bbc_short"
    (run / "units" / "seed0").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"name": "bbc_short", "seeds": [0]}))
    invocations = [
        {"command": ["/venv/bin/baa", "experiment", "configs/bbc_short.yaml"], "started": "2025-01-02T10:00:00+0000", "commit": "aaa", "dirty": False},
        {"command": ["/venv/bin/baa", "experiment", "configs/bbc_short.yaml", "--set", "note=a b"], "started": "2025-01-03T09:00:00+0000",
         "commit": "bbb", "dirty": True},
    ]
    (run / "run_info.json").write_text(json.dumps({"seeds": [0], "environment": _env(commit=COMMIT, dirty=True), "invocations": invocations}))
    rows = [
        {"method": "dense", "budget": 1.0, "seed": 0, "accuracy": 0.95, "val_accuracy": 0.94, "cost": 1.0, "cost_kind": "dense", "steps": 2000},
        _soft(0.2, 0.18, test=0.99, val=0.90, seed=0),  # best test within C <= 0.30, but not the best validation
        _soft(0.3, 0.28, test=0.95, val=0.93, seed=0),
        _soft(0.5, 0.45, test=0.96, val=0.95, seed=0),
        {"method": "budgeted-hard", "budget": 0.5, "seed": 0, "accuracy": 0.93, "val_accuracy": 0.92, "cost": 0.5,
         "cost_kind": "kept-heads", "steps": 3500, "speedup": 1.3, "ideal_speedup": 1.33, "transformers_speedup": 1.21},
    ]
    (run / "results.json").write_text(json.dumps({"rows": rows}))
    for name, seconds in (("dense", 100.0), ("budgeted", 23.4)):
        (run / "units" / "seed0" / f"{name}.json").write_text(json.dumps({"rows": [], "seconds": seconds}))
    bench = {
        "rows": [{"budget": 0.5, "batch_size": 1, "seq_len": 128, "threads": 1, "dense_latency_ms": 13.0, "latency_ms": 10.0,
                  "speedup": 1.3, "ideal_speedup": 1.33, "efficiency": 0.98, "heads_kept": 8, "heads_per_layer": [2, 2, 2, 2],
                  "transformers_speedup": 1.21, "plain_speedup": 1.3}],
        "gate_overhead": [{"batch_size": 1, "seq_len": 128, "threads": 1, "plain_latency_ms": 13.0, "gated_b1_latency_ms": 13.1, "overhead": 0.0077}],
        "setting": {"threads": 1, "rounds": 3, "dense_reference": "unmodified transformers BertForSequenceClassification (SDPA)"},
        "checkpoint": "runs/bbc/checkpoints/seed0/budgeted-hard.json",
    }
    (run / "bench.json").write_text(json.dumps(bench))
    _png(run / "accuracy_vs_budget.png")
    return run


def make_old_demo_run(root: Path) -> Path:
    """An old-style demo run: no config name, old rows (no val_accuracy), bench with sliced speedups and switch."""
    run = root / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seeds": [0, 1]}))
    (run / "run_info.json").write_text(json.dumps({"seeds": [0, 1], "environment": _env(),
                                                    "invocations": [{"command": ["baa", "demo"], "started": "2024-12-01T08:00:00+0000"}]}))
    rows = [{"method": "budgeted", "budget": 0.3, "seed": s, "accuracy": 0.99, "estimated_cost": 0.2} for s in (0, 1)]
    rows += [{"method": "budgeted-hard", "budget": 0.3, "seed": s, "accuracy": 0.9, "estimated_cost": 0.25, "heads_kept": 4,
              "accuracy_before_adaptation": 0.5, "speedup": 1.5, "ideal_speedup": 1.6} for s in (0, 1)]
    (run / "results.json").write_text(json.dumps({"rows": rows}))
    (run / "results.md").write_text("# baa demo results\n\nWall time: 566 s.\n")
    bench = {"rows": [{"budget": 0.3, "batch_size": 1, "seq_len": 128, "threads": 1, "dense_latency_ms": 9.7, "latency_ms": 6.8,
                       "speedup": 1.43, "ideal_speedup": 1.41, "efficiency": 1.02, "heads_kept": 8, "heads_per_layer": [4, 2, 1, 1],
                       "sliced_speedup": 1.42}],
             "gate_overhead": [], "switch": {"switch_ms": 0.0107, "budgets": [0.3, 1.0]}, "setting": {"threads": 1}}
    (run / "bench.json").write_text(json.dumps(bench))
    _png(run / "accuracy_vs_cost.png")
    _png(run / "speedup.png")
    return run


def _section(text: str, name: str) -> str:
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def test_report_from_run_dirs(tmp_path):
    exp, demo = make_experiment_run(tmp_path), make_old_demo_run(tmp_path)
    out = tmp_path / "docs" / "results.md"
    written = write_report([exp, demo], out, title="My results", command=["baa", "report", "runs/bbc_short", "runs/demo", "--out", "docs/results.md"])
    assert written == out
    text = out.read_text()
    assert text.startswith("# My results\n")
    assert "Generated by `baa report runs/bbc_short runs/demo --out docs/results.md`" in text
    assert "written from the run directories by this command" in text
    assert text.index("## bbc_short") < text.index("## demo")

    bbc = _section(text, "bbc_short")
    assert "2 invocations" in bbc
    assert "baa experiment configs/bbc_short.yaml\n" in bbc and "baa experiment configs/bbc_short.yaml --set 'note=a b'" in bbc
    assert f"commit `{COMMIT}` (dirty" in bbc and "2025-01-02T10:00:00+0000" in bbc
    assert "x86_64, 2 CPUs, Python 3.11.7, torch 2.13.0+cpu" in bbc
    assert "123 s of compute over 2 finished unit(s)" in bbc
    assert "Invocations ran at commits `aaa`, `bbb` (dirty)" in bbc  # a resumed run names each invocation's code
    assert "| budgeted | 0.30 | 1 | 3,000 | 93.00 ± 0.00 | 95.00 ± 0.00 | ~0.280 |" in bbc
    assert "vs transformers" in bbc and "1.21x" in bbc
    # headline: chosen by validation (b=0.3, test 95 %), not by test (b=0.2, test 99 %)
    headline = bbc.split(": headline", 1)[1].split("###", 1)[0]
    assert "95.00% (val. 93.00%, b=0.30" in headline and "99.00%" not in headline
    assert "Dense reference: unmodified transformers" in bbc and "| 0.98 | 1.21x |" in bbc  # vs transformers
    assert "![bbc_short: accuracy vs budget](figures/bbc_short_accuracy_vs_budget.png)" in bbc

    old = _section(text, "demo")
    assert "```\nbaa demo\n```" in old and "commit not recorded" in old
    assert "566 s (as recorded in results.md)" in old
    assert "~0.200" in old and "no validation figure" in old
    assert "1.43x" in old and "10.7 µs" in old  # an earlier release's sliced speedup (now the row's own) is not a column
    for name in ("demo_accuracy_vs_cost.png", "demo_speedup.png", "bbc_short_accuracy_vs_budget.png"):
        copied = tmp_path / "docs" / "figures" / name
        assert copied.is_file() and copied.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "docs").rglob("*.tmp"))


def test_build_report_links_relative_to_out(tmp_path):
    demo = make_old_demo_run(tmp_path)
    text = build_report([demo], figures_dir=tmp_path / "site" / "img", title="T", out=tmp_path / "docs" / "r.md", command="baa report x")
    assert "(../site/img/demo_speedup.png)" in text


def test_render_command():
    assert render_command(["/x/.venv/bin/baa", "bench", "runs/a b"]) == "baa bench 'runs/a b'"
    assert render_command(["/x/src/budgeted_attention/cli.py", "demo"]) == "baa demo"
    assert render_command(None) == "(not recorded)"


def test_cli_report_prints_path_and_default_figures_dir(tmp_path, capsys):
    demo = make_old_demo_run(tmp_path)
    out = tmp_path / "out" / "results.md"
    assert main(["report", str(demo), "--out", str(out), "--title", "Demo only"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    text = out.read_text()
    assert text.startswith("# Demo only") and f"`baa report {demo} --out {out} --title 'Demo only'`" in text
    assert (tmp_path / "out" / "figures" / "demo_speedup.png").is_file()


def _break_missing(run: Path) -> Path:
    return run.parent / "nope"


def _break_no_results(run: Path) -> Path:
    (run / "results.json").unlink()
    return run


def _break_results_json(run: Path) -> Path:
    (run / "results.json").write_text('{"rows": [')
    return run / "results.json"


def _break_bench_json(run: Path) -> Path:
    (run / "bench.json").write_text("not json")
    return run / "bench.json"


def _break_run_info(run: Path) -> Path:
    (run / "run_info.json").write_text("{")
    return run / "run_info.json"


@pytest.mark.parametrize("breaker", [_break_missing, _break_no_results, _break_results_json, _break_bench_json, _break_run_info])
def test_cli_errors_name_the_path(tmp_path, capsys, breaker):
    run = make_old_demo_run(tmp_path)
    named = breaker(run)
    out = tmp_path / "docs" / "results.md"
    code = main(["report", str(run if breaker is not _break_missing else named), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("baa: error: "), err
    assert str(named) in lines[0]
    assert not out.exists() and not (tmp_path / "docs" / "figures").exists()


def test_environment_info_records_provenance_and_never_fails(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from budgeted_attention.io import environment_info, source_provenance

    info = environment_info()
    assert "commit" in info and "dirty" in info
    assert source_provenance(tmp_path) == {"commit": None, "dirty": None}  # not a git checkout
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    pkg = repo / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    assert source_provenance(pkg) == {"commit": head, "dirty": False}
    (pkg / "mod.py").write_text("x = 2\n")
    assert source_provenance(pkg) == {"commit": head, "dirty": True}
    untracked = repo / "venv" / "site-packages" / "pkg"  # installed copy inside some repository: not its source
    untracked.mkdir(parents=True)
    (untracked / "mod.py").write_text("x = 1\n")
    assert source_provenance(untracked) == {"commit": None, "dirty": None}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # git missing
    assert source_provenance(pkg) == {"commit": None, "dirty": None}


def test_an_invocation_without_a_recorded_commit_is_named_as_such():
    from budgeted_attention.reporting.report import _environment_lines

    info = {"environment": {"commit": "bbb", "dirty": False},
            "invocations": [{"command": ["baa"], "started": "2025-01-01"}, {"command": ["baa"], "started": "2025-01-02", "commit": "bbb"}]}
    assert "- Invocations ran at commits not recorded, `bbb` (in order; the line above is the latest)" in _environment_lines(info)
    same = {"environment": {"commit": "bbb"}, "invocations": [{"commit": "bbb"}, {"commit": "bbb"}]}
    assert not any("Invocations ran" in line for line in _environment_lines(same))


def test_sections_are_named_after_run_directories(tmp_path):
    exp = make_experiment_run(tmp_path)
    seed0 = make_experiment_run(tmp_path / "other").rename(tmp_path / "other" / "runs" / "bbc_short_seed0")
    out = tmp_path / "docs" / "results.md"
    write_report([exp, seed0], out, command="baa report runs/bbc_short runs/bbc_short_seed0 --out docs/results.md")
    text = out.read_text()
    assert "## bbc_short\n" in text and "## bbc_short_seed0\n" in text  # config name bbc_short, its own section
    assert "- Config name: `bbc_short` (the run directory has another name" in _section(text, "bbc_short_seed0")
    assert "Config name" not in _section(text, "bbc_short")


def test_bench_table_shows_onnx_runtime_columns_when_timed():
    from budgeted_attention.reporting.report import bench_table  # noqa: PLC0415

    row = {"budget": 0.5, "batch_size": 1, "seq_len": 128, "threads": 1, "dense_latency_ms": 20.0, "latency_ms": 12.0,
           "speedup": 1.67, "ideal_speedup": 2.0, "efficiency": 0.83, "heads_kept": 8}
    plain = bench_table({"rows": [row]})
    assert "ORT" not in plain
    timed = bench_table({"rows": [{**row, "onnx_dense_latency_ms": 18.0, "onnx_latency_ms": 9.5, "onnx_speedup": 1.89, "onnx_efficiency": 0.95}],
                         "setting": {"onnx": "onnxruntime 1.32.0, 1 intra-op thread(s), b = 1 graph as its reference"}})
    assert "| ORT dense ms | ORT pruned ms | ORT speedup | ORT / ideal |" in timed
    assert "| 18.000 | 9.500 | 1.89x | 0.95 |" in timed
    assert "ORT: onnxruntime 1.32.0" in timed


def test_a_folder_without_results_is_refused_saying_what_is_missing(tmp_path):
    from budgeted_attention.reporting.report import load_run
    from budgeted_attention.rundir import RunDirError

    with pytest.raises(RunDirError, match=rf"^'{tmp_path}' is not a run directory: no results.json \(run it to completion first\)$"):
        load_run(tmp_path)
    with pytest.raises(RunDirError, match=f"run directory not found: '{tmp_path / 'missing'}'"):
        load_run(tmp_path / "missing")


def test_a_second_page_never_takes_over_the_figures_another_page_shows(tmp_path):
    first = make_old_demo_run(tmp_path)
    second = make_old_demo_run(tmp_path / "elsewhere")  # another run directory named demo
    lab = tmp_path / "docs" / "lab"
    write_report([first], lab / "a.md", command="baa report runs/demo --out docs/lab/a.md")
    before = (lab / "figures" / "demo_speedup.png").read_bytes()
    write_report([first], lab / "a.md", command="baa report runs/demo --out docs/lab/a.md")  # the same page again: fine
    with pytest.raises(Exception, match=r"demo_\w+.png' is shown by '.*a.md': give this report its own --figures-dir"):
        write_report([second], lab / "b.md", command="baa report elsewhere/runs/demo --out docs/lab/b.md")
    assert not (lab / "b.md").exists() and (lab / "figures" / "demo_speedup.png").read_bytes() == before
    write_report([second], lab / "b.md", figures_dir=lab / "figures" / "b", command="x")  # its own folder: written
    assert (lab / "figures" / "b" / "demo_speedup.png").is_file()
