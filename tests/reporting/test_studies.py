"""`baa report --studies`: docs/results.md and README's headline from the studies' run directories."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from budgeted_attention.cli import main
from budgeted_attention.reporting.report import ReportError
from budgeted_attention.reporting.studies import BEGIN, END, load_studies, write_studies_report
from conftest import TINY_DATA_AND_MODEL

REPO = Path(__file__).resolve().parents[2]
COMMAND = "baa report --studies studies.yaml --out docs/results.md"


def _run(root: Path, name: str, rows: list[dict], processor: str = "Intel Xeon", **files) -> Path:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"rows": rows}))
    (run / "run_info.json").write_text(json.dumps({"seeds": sorted({r["seed"] for r in rows}) or [0],
                                                   "environment": {"processor": processor, "cpu_count": 2}}))
    for file, data in files.items():
        (run / file.replace("__", ".")).write_text(json.dumps(data))
    return run


def _sweep_rows(drop: float = 0.0) -> list[dict]:
    rows = []
    for seed in (0, 1):
        rows.append({"method": "dense", "budget": 1.0, "seed": seed, "accuracy": 0.90 + 0.01 * seed, "cost": 1.0, "cost_kind": "dense"})
        rows.append({"method": "budgeted-hard", "budget": 0.5, "seed": seed, "accuracy": 0.895 - drop, "cost": 0.5,
                     "cost_kind": "kept-heads", "speedup": 1.6 + 0.1 * seed, "ideal_speedup": 1.9})
        rows.append({"method": "budgeted-hard", "budget": 0.25, "seed": seed, "accuracy": 0.80, "cost": 0.25,  # the weak row
                     "cost_kind": "kept-heads", "speedup": 0.9, "ideal_speedup": 3.0})
        rows.append({"method": "budgeted-hard", "budget": 0.99, "seed": seed, "accuracy": 0.90, "cost": 1.0,  # nothing removed
                     "cost_kind": "kept-heads", "speedup": 0.99, "ideal_speedup": 1.0})
    return rows


def _studies(root: Path) -> Path:
    studies = [
        {"name": "demo", "question": "Does it hold?", "config": "configs/x.yaml", "seeds": [0, 1],
         "commands": ["baa demo --no-progress --out runs/demo"], "figure": "accuracy_vs_speedup.png",
         "table": {"kind": "sweep", "methods": ["dense", "budgeted-hard"], "target": {"max_drop": 1.0, "min_speedup": 1.0}},
         "headline": [{"method": "budgeted-hard", "budget": 0.5}], "replicas": ["runs/demo_other"]},
        {"name": "onnx", "question": "Is ONNX faster?", "config": "configs/d.yaml", "seeds": [0],
         "commands": ["baa demo --out runs/d", "baa bench runs/d --onnx --json runs/d/bench_onnx.json"],
         "table": {"kind": "bench", "file": "bench_onnx.json", "speedup": "onnx_speedup", "target": {"min_speedup": 1.0}}},
        {"name": "serving", "question": "Does the SLO hold?", "config": "configs/m.yaml", "seeds": [0],
         "commands": ["baa experiment c.yaml --out runs/m", "python benchmarks/serve_load.py runs/m --out runs/load"],
         "table": {"kind": "serve", "run": "runs/load", "target": {"min_slo": 0.9}}, "headline": [{"mode": "slo"}]},
        {"name": "ladder", "question": "Above the ladder?", "config": "configs/l.yaml", "seeds": [0, 1, 2],
         "commands": ["baa experiment configs/l.yaml --out runs/l"], "table": {"kind": "ladder"}},
        {"name": "lm", "question": "Never run here?", "config": "configs/lm.yaml", "seeds": [0],
         "commands": ["baa lm configs/lm.yaml --out runs/lm"], "table": {"kind": "sweep"}},
    ]
    path = root / "studies.yaml"
    path.write_text(yaml.safe_dump({"studies": studies}, sort_keys=False))
    return path


def _section(text: str, name: str) -> str:
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def test_studies_page_tables_targets_replication_and_readme(tmp_path):
    studies = _studies(tmp_path)
    demo = _run(tmp_path, "demo", _sweep_rows())
    (demo / "accuracy_vs_speedup.png").write_bytes(b"\x89PNG")
    _run(tmp_path, "demo_other", _sweep_rows(drop=0.02), processor="AMD EPYC")
    bench = {"rows": [{"budget": b, "batch_size": 1, "seq_len": 128, "threads": 1, "onnx_speedup": s, "ideal_speedup": 2.0}
                      for b, s in ((0.5, 1.4), (0.75, 0.95))]}
    _run(tmp_path, "d", [], bench_onnx__json=bench)
    trials = [{"arrivals": "bursty", "load": 2.0, "mode": mode, "repeat": r,
               "summary": {"slo_attainment": slo - 0.01 * r, "effective_accuracy": 0.9, "p99_ms": 50.0, "server_errors": 0}}
              for mode, slo in (("fixed-1", 0.4), ("slo", 0.97)) for r in (0, 1)]
    _run(tmp_path, "m", _sweep_rows())  # the served model: no serve_load.json, so not a replica of the load test
    _run(tmp_path, "load", [], serve_load__json={"trials": trials, "setting": {}})
    ladder = []
    for seed in (0, 1, 2):  # the curve 2 points above the faster ladder model, 3 below the slower one, in every seed
        ladder += [{"method": "budgeted-hard", "budget": b, "seed": seed, "accuracy": a + 0.001 * seed, "cost": b, "cost_kind": "kept-heads",
                    "speedup": s} for b, a, s in ((0.25, 0.82, 3.0), (0.5, 0.85, 2.0), (1.0, 0.90, 1.0))]
        ladder += [{"method": "ladder", "variant": v, "budget": c, "seed": seed, "accuracy": a, "cost": c, "cost_kind": "smaller-dense",
                    "speedup": s} for v, c, a, s in (("fast", 0.3, 0.80, 3.0), ("slow", 0.6, 0.88, 1.5))]
    _run(tmp_path, "l", ladder)
    for part in ("p0", "p1"):  # the ladder run was merged from parts, timed on two machines
        _run(tmp_path, part, ladder, processor=f"CPU of {part}")
    info = json.loads((tmp_path / "runs" / "l" / "run_info.json").read_text())
    info["invocations"] = [{"part": "runs/p0", "command": ["baa"]}, {"part": "runs/p1", "command": ["baa"]}, {"command": ["baa", "merge"]}]
    (tmp_path / "runs" / "l" / "run_info.json").write_text(json.dumps(info))
    stale = tmp_path / "docs" / "figures" / "demo_old.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Project\n\nintro\n{BEGIN}\nold table\n{END}\n\nrest\n")

    write_studies_report(studies, tmp_path / "docs" / "results.md", readme=readme, command=COMMAND)
    text = (tmp_path / "docs" / "results.md").read_text()
    demo_text = _section(text, "demo")
    assert "**Question.** Does it hold?" in demo_text and "baa demo --no-progress --out runs/demo" in demo_text
    assert "- Config: `configs/x.yaml`; seeds: 0, 1" in demo_text and "- Machine: Intel Xeon, 2 CPUs" in demo_text
    assert "| budgeted-hard | 0.50 | 2 | 89.50 ± 0.00 [89.50, 89.50] | 0.500 | 1.65 ± 0.07x | 1.90x | meets |" in demo_text
    weak = next(line for line in demo_text.splitlines() if line.startswith("| budgeted-hard | 0.25 "))
    assert "FAILS: 10.50 points below dense (target ≤ 1); 0.90x (target ≥ 1x)" in weak
    assert "| budgeted-hard | 0.99 | 2 | 90.00 ± 0.00 [90.00, 90.00] | 1.000 | 0.99 ± 0.00x | 1.00x | meets |" in demo_text  # no speedup to meet
    assert "**" not in "".join(line for line in text.splitlines() if line.startswith("|"))  # no row bolded
    assert "![demo: accuracy_vs_speedup](figures/demo_accuracy_vs_speedup.png)" in demo_text and "± one std over seeds" in demo_text
    assert (tmp_path / "docs" / "figures" / "demo_accuracy_vs_speedup.png").is_file() and not stale.exists()
    # the run's PNG is a 4-byte stub: the page's sweep figure is drawn anew from the run's rows
    assert (tmp_path / "docs" / "figures" / "demo_accuracy_vs_speedup.png").stat().st_size > 1000
    assert "| 0.75 | 1 | 128 | 1 | 0.95x | 2.00x | FAILS: 0.95x (target ≥ 1x) |" in _section(text, "onnx")
    serving = _section(text, "serving")
    assert "| bursty | 2x | fixed-1 | 2 | 39.5 ± 0.7 [39.0, 40.0] |" in serving and "FAILS: SLO attainment 39.5% (target ≥ 90%)" in serving
    lad = _section(text, "ladder")
    assert "| budgeted-hard | fast (cost 0.30) | 3 of 3 | 3.00x | 80.00 ± 0.00 | 82.10 ± 0.10 | +2.10 ± 0.10 |" in lad
    slow = next(line for line in lad.splitlines() if "slow (cost 0.60)" in line)
    assert slow.endswith("| FAILS: below the ladder model |") and "| +2.10" not in slow
    assert _section(text, "lm").strip().endswith("not run here: `make study-lm`") and "|" not in _section(text, "lm")
    replication = _section(text, "Replication")  # demo measured on two machines; serving's model dir is no replica
    assert "`runs/demo`" in replication and "`runs/demo_other`" in replication and "AMD EPYC, 2 CPUs" in replication
    assert "`runs/p0`" in replication and "CPU of p1, 2 CPUs" in replication  # a merged run's parts replicate it
    assert "serving" not in replication and "budget 0.25" not in replication  # the headline rows only
    assert text.count("\n|---") <= 10

    block = readme.read_text()
    assert block.startswith(f"# Project\n\nintro\n{BEGIN}\n") and block.endswith(f"{END}\n\nrest\n") and "old table" not in block
    rows = [line for line in block.splitlines() if line.startswith("| [")]
    assert [re.match(r"\| \[(\w+)\]\(docs/results.md#\1\)", r).group(1) for r in rows] == ["demo", "onnx", "serving", "ladder", "lm"]
    assert "acc. % 89.50" in rows[0] and "not run here: `make study-lm`" in rows[4]


def test_missing_markers_fail_before_anything_is_written(tmp_path):
    studies = _studies(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(ReportError, match="has no '<!-- headline:begin -->' line"):
        write_studies_report(studies, tmp_path / "docs" / "results.md", readme=readme)
    assert not (tmp_path / "docs").exists() and readme.read_text() == "# no markers\n"


def test_cli_prints_commands_and_checks_the_file(tmp_path, capsys):
    studies = _studies(tmp_path)
    assert main(["report", "--studies", str(studies), "--commands", "onnx", "lm"]) == 0
    assert capsys.readouterr().out.splitlines() == ["baa demo --out runs/d", "baa bench runs/d --onnx --json runs/d/bench_onnx.json",
                                                    "baa lm configs/lm.yaml --out runs/lm"]
    assert main(["report", "--studies", str(studies), "--commands", "nope"]) == 2
    assert "no study named nope" in capsys.readouterr().err
    assert main(["report", "runs/x", "--studies", str(studies), "--out", "x.md"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"studies": [{"name": "x", "question": "q", "config": "c", "seeds": [0], "commands": ["baa demo"],
                                                "table": {"kind": "sweep"}}]}))
    with pytest.raises(ReportError, match="one or more with '--out RUN_DIR'"):
        load_studies(bad)
    bad.write_text(yaml.safe_dump({"studies": [{"name": "x", "question": "q", "config": "c", "seeds": [0], "commands": ["baa demo --out runs/x"],
                                                "table": {"kind": "sweep", "target": {"max_dorp": 1.0}}}]}))
    with pytest.raises(ReportError, match="'table.target' of a sweep table takes .*max_drop.*; not max_dorp"):
        load_studies(bad)  # a misspelt target key would judge nothing


def test_a_tiny_real_run_renders_with_its_figure(tmp_path):
    from budgeted_attention.pipeline import Experiment, load_experiment_config  # noqa: PLC0415

    config = tmp_path / "tiny.yaml"
    config.write_text(f"name: tiny\nseeds: [0, 1]\nmethods: [dense, budgeted, budgeted-hard]\nbudgets: [0.5, 1.0]\n{TINY_DATA_AND_MODEL}\n"
                      "train: {dense_steps: 4, budgeted_steps: 4, hard_steps: 2, batch_size: 8}\n"
                      "bench: {rounds: 1, min_run_time: 0.005, batch_sizes: [1]}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Experiment(load_experiment_config(str(config)), tmp_path / "runs" / "tiny", progress=False, log=lambda *_: None).run()
    studies = tmp_path / "studies.yaml"
    studies.write_text(yaml.safe_dump({"studies": [{
        "name": "tiny", "question": "Tiny?", "config": str(config), "seeds": [0, 1], "commands": ["baa experiment tiny.yaml --out runs/tiny"],
        "table": {"kind": "sweep", "target": {"max_drop": 100.0}}, "figure": "accuracy_vs_speedup.png"}]}))
    out = tmp_path / "docs" / "results.md"
    assert main(["report", "--studies", str(studies), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| budgeted-hard | 0.50 | 2 |" in text and "- Config:" in text and "seeds: 0, 1" in text
    assert (tmp_path / "docs" / "figures" / "tiny_accuracy_vs_speedup.png").stat().st_size > 1000


def _image_links(page: Path) -> list[Path]:
    return [(page.parent / link).resolve() for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())]


def test_docs_figures_come_from_the_generated_report_and_every_link_resolves():
    results, log = REPO / "docs" / "results.md", REPO / "docs" / "lab" / "results-log.md"
    linked = set(_image_links(results))
    assert linked == {p.resolve() for p in (REPO / "docs" / "figures").glob("*")}  # docs/figures: the report's, all of them
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:  # any other page shows the report's figures only
        assert set(_image_links(page)) <= linked, page
    missing = [p for p in _image_links(log) if not p.is_file()]
    assert not missing and log.read_text().startswith("> ")


def test_the_committed_page_is_the_commands_output_for_every_archived_study(tmp_path):
    """Every study the archive holds reads in docs/results.md exactly as the command writes it from
    the archive (a study measured before the archive existed is left to its next run)."""
    committed = (REPO / "docs" / "results.md").read_text()
    shutil.copy(REPO / "studies.yaml", tmp_path / "studies.yaml")
    if (REPO / "docs" / "runs").is_dir():
        shutil.copytree(REPO / "docs" / "runs", tmp_path / "docs" / "runs")
    write_studies_report(tmp_path / "studies.yaml", tmp_path / "docs" / "results.md", command=COMMAND)
    fresh = (tmp_path / "docs" / "results.md").read_text()
    archived = [s["name"] for s in load_studies(REPO / "studies.yaml") if "not run here" not in _section(fresh, s["name"])]
    for name in archived:
        assert _section(fresh, name) == _section(committed, name), name
    header = lambda text: [line for line in text.split("\n## ", 1)[0].splitlines() if not line.startswith("Generated by")]  # noqa: E731
    assert header(fresh) == header(committed)


def test_decode_study_table_marks_rows_below_the_flop_ideal_and_lists_the_checks(tmp_path):
    studies = [{"name": "gemma_decode", "question": "Faster decoding?", "config": "benchmarks/gemma_decode.py", "seeds": [0],
                "commands": ["python benchmarks/gemma_decode.py --out runs/g"], "table": {"kind": "decode", "target": {"min_efficiency": 0.9, "phases": ["decode"]}},
                "headline": [{"phase": "decode", "budget": 0.5}]}]
    path = tmp_path / "studies.yaml"
    path.write_text(yaml.safe_dump({"studies": studies}))
    rows = [{"phase": "decode", "budget": b, "batch_size": 1, "tokens": 128, "threads": 1, "ms": ms, "reference_ms": 1100.0,
             "tokens_per_s": 128 / (ms / 1e3), "speedup": 1000.0 / ms, "library_speedup": 1100.0 / ms, "ideal_speedup": ideal,
             "output_layer_share": 0.6, "kv_bytes_per_token": 6144, "kv_sliding_cap_bytes": 2**20}
            for b, ms, ideal in ((1.0, 1000.0, 1.0), (0.5, 850.0, 1.25), (0.25, 700.0, 1.7))]
    rows.append({**rows[1], "phase": "prefill", "speedup": 1.0})  # 0.8 of its ideal, but the target is the decode phase's
    _run(tmp_path, "g", [], decode_bench__json={"rows": rows, "checks": {"switch_ms_median": 0.05, "bit_exact": True}})
    write_studies_report(path, tmp_path / "docs" / "results.md", command=COMMAND)
    text = _section((tmp_path / "docs" / "results.md").read_text(), "gemma_decode")
    half = next(line for line in text.splitlines() if line.startswith("| decode | 0.50 "))
    assert "| 1.18x | 1.29x | 1.25x | 0.94 | 60% | 6.0 KiB + 1.0 MiB | meets |" in half
    quarter = next(line for line in text.splitlines() if line.startswith("| decode | 0.25 "))
    assert quarter.endswith("| FAILS: 0.84 of the FLOP-ideal (target ≥ 0.9) |")  # 1.43x of 1.70x
    dense = next(line for line in text.splitlines() if line.startswith("| decode | 1.00 "))
    assert "| 1.10x |" in dense and dense.endswith("| no target |")  # the dense row has no speedup to judge
    prefill = next(line for line in text.splitlines() if line.startswith("| prefill | 0.50 "))
    assert "| 0.80 |" in prefill and prefill.endswith("| no target |")
    assert "- switch ms median: 0.05" in text and "- bit exact: true" in text


def test_archive_keeps_a_study_measured_on_an_earlier_machine(tmp_path):
    """With ``archive:``, the report archives every run directory it finds (records only, no
    weights) and reads the page from the archive: the run directory may then be gone."""
    studies = _studies(tmp_path)
    data = yaml.safe_load(studies.read_text())
    studies.write_text(yaml.safe_dump({"archive": "docs/runs", **data}, sort_keys=False))
    demo = _run(tmp_path, "demo", _sweep_rows(), processor="AMD EPYC")
    (demo / "accuracy_vs_speedup.png").write_bytes(b"\x89PNG")
    (demo / "checkpoints" / "seed0").mkdir(parents=True)
    (demo / "checkpoints" / "seed0" / "budgeted-hard.safetensors").write_bytes(b"weights")
    (demo / "units" / "seed0").mkdir(parents=True)
    (demo / "units" / "seed0" / "dense.json").write_text(json.dumps({"seconds": 12.0}))
    (demo / "tokenizer.json").write_text("{}")
    write_studies_report(studies, tmp_path / "docs" / "results.md", command=COMMAND)
    first = (tmp_path / "docs" / "results.md").read_text()

    archived = tmp_path / "docs" / "runs" / "demo"
    kept = sorted(str(p.relative_to(archived)) for p in archived.rglob("*") if p.is_file())
    assert kept == ["accuracy_vs_speedup.png", "results.json", "run_info.json", "units/seed0/dense.json"]
    assert "- Machine: AMD EPYC, 2 CPUs (from `docs/runs/demo/run_info.json`)" in _section(first, "demo")

    shutil.rmtree(tmp_path / "runs")  # another machine: the run directories are gone, the archive is in git
    write_studies_report(studies, tmp_path / "docs" / "results.md", command=COMMAND)
    assert (tmp_path / "docs" / "results.md").read_text() == first
    assert (tmp_path / "docs" / "figures" / "demo_accuracy_vs_speedup.png").is_file()

    _run(tmp_path, "demo", _sweep_rows(drop=0.02), processor="Intel Xeon")  # run again: the new records replace the old
    write_studies_report(studies, tmp_path / "docs" / "results.md", command=COMMAND)
    again = _section((tmp_path / "docs" / "results.md").read_text(), "demo")
    assert "Intel Xeon" in again and "87.50" in again and not (archived / "accuracy_vs_speedup.png").exists()
    assert not [p for p in archived.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_the_archive_never_swallows_a_run_directory_nor_takes_a_partial_run(tmp_path):
    from budgeted_attention.rundir import RunDir, RunDirError

    studies = _studies(tmp_path)
    data = yaml.safe_load(studies.read_text())
    demo = _run(tmp_path, "demo", _sweep_rows())
    (demo / "model.safetensors").write_bytes(b"weights")
    studies.write_text(yaml.safe_dump({"archive": "runs", **data}, sort_keys=False))  # runs/demo -> runs/demo itself
    with pytest.raises(RunDirError, match="one folder holds the other"):
        write_studies_report(studies, tmp_path / "docs" / "results.md", command=COMMAND)
    assert (demo / "model.safetensors").is_file()
    with pytest.raises(RunDirError, match="one folder holds the other"):
        RunDir(demo).archive(demo / "inner")

    studies.write_text(yaml.safe_dump({"archive": "docs/runs", **data}, sort_keys=False))
    (demo / "results.json").write_text(json.dumps({"rows": _sweep_rows(), "partial": "1 of 2 seeds"}))
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(ReportError, match="headline"):  # a failing command leaves the archive as it was
        write_studies_report(studies, tmp_path / "docs" / "results.md", readme=readme, command=COMMAND)
    assert not (tmp_path / "docs" / "runs").exists()
    write_studies_report(studies, tmp_path / "docs" / "results.md", command=COMMAND)
    assert not (tmp_path / "docs" / "runs" / "demo").exists()  # a partial run is never archived


def test_an_interrupted_archive_swap_is_restored(tmp_path):
    from budgeted_attention.rundir import RunDir

    demo = _run(tmp_path, "demo", _sweep_rows())
    target = tmp_path / "archive" / "demo"
    RunDir(demo).archive(target)
    target.rename(target.with_name(".demo.old-1"))  # stopped between the two renames
    (tmp_path / "archive" / ".demo.tmp-2").mkdir()
    RunDir(demo).archive(target)
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == ["demo"]
    assert (target / "results.json").is_file()


@pytest.mark.parametrize("value", ["/abs/runs", "../elsewhere", "", 3])
def test_a_bad_archive_folder_is_named(tmp_path, value):
    path = _studies(tmp_path)
    path.write_text(yaml.safe_dump({"archive": value, **yaml.safe_load(path.read_text())}))
    with pytest.raises(ReportError, match="'archive' is a folder relative to the studies file"):
        write_studies_report(path, tmp_path / "docs" / "results.md", command=COMMAND)


def test_a_study_measured_before_the_archive_keeps_its_section_until_it_runs_again(tmp_path):
    """A study the report cannot read (no run directory, nothing archived) keeps its measured section
    of the page it replaces, its README rows, figure and replication rows, under a note naming the
    command that measures it again; a study never measured stays one line; a new run replaces the kept one."""
    studies = _studies(tmp_path)
    (_run(tmp_path, "demo", _sweep_rows()) / "accuracy_vs_speedup.png").write_bytes(b"\x89PNG")
    _run(tmp_path, "demo_other", _sweep_rows(), processor="AMD EPYC")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Project\n{BEGIN}\n{END}\n")
    out = tmp_path / "docs" / "results.md"
    write_studies_report(studies, out, readme=readme, command=COMMAND)
    first, first_readme = out.read_text(), readme.read_text()
    figure = tmp_path / "docs" / "figures" / "demo_accuracy_vs_speedup.png"
    assert figure.is_file() and "`runs/demo_other`" in _section(first, "Replication")

    shutil.rmtree(tmp_path / "runs")  # the machine changed: the run directories are gone, none archived
    write_studies_report(studies, out, readme=readme, command=COMMAND)
    kept = out.read_text()
    demo = _section(kept, "demo")
    note = ("*Kept from this page's previous generation: this study's run directories could not be read here and were not archived, "
            "so the table below is the one measured then, its target column as judged then. `make study-demo` measures it anew.*\n\n")
    assert note in demo and demo.replace(note, "") == _section(first, "demo") and "studies.yaml has changed" not in demo
    assert _section(kept, "lm").strip().endswith("not run here: `make study-lm`")  # never measured: still one line
    assert _section(kept, "Replication") == _section(first, "Replication") and figure.is_file()
    # the demo row is the measured one, not "not run here", and says it is kept
    demo_row = _study_line(first_readme, "demo")
    kept_row = demo_row.replace("| budgeted-hard b = 0.5:", "| kept from an earlier run: budgeted-hard b = 0.5:").replace("| meets |", "| judged then: meets |")
    assert readme.read_text() == first_readme.replace(demo_row, kept_row) and kept_row != demo_row

    write_studies_report(studies, out, readme=readme, command=COMMAND)  # kept again: one note, same page
    assert out.read_text() == kept
    out.write_text(kept.replace(note, "*Kept from this page's previous generation: an older wording of the note.*\n\n"))
    write_studies_report(studies, out, readme=readme, command=COMMAND)  # a note of an earlier release is replaced, not stacked
    assert out.read_text() == kept

    data = yaml.safe_load(studies.read_text())  # studies.yaml rewords the question and changes the commands
    data["studies"][0]["question"] = "Does it still hold?"
    data["studies"][0]["commands"] = ["baa demo --out runs/demo"]
    studies.write_text(yaml.safe_dump(data, sort_keys=False))
    write_studies_report(studies, out, readme=readme, command=COMMAND)
    demo = _section(out.read_text(), "demo")
    assert demo.count("Kept from") == 1 and "**Question.** Does it still hold?" in demo and "Does it hold?" not in demo
    assert "studies.yaml has changed this study's commands since" in demo and "baa demo --no-progress --out runs/demo" in demo
    # README does not headline figures of other commands: the row says the study has not run with these
    assert _study_line(readme.read_text(), "demo") == ("| [demo](docs/results.md#demo) | Does it still hold? | not run here with its current commands: "
                                                       "`make study-demo` (the results page keeps the earlier table) |  |")

    _run(tmp_path, "demo", _sweep_rows(drop=0.05))  # measured again: the new table replaces the kept one
    write_studies_report(studies, out, readme=readme, command=COMMAND)
    fresh = _section(out.read_text(), "demo")
    assert "Kept from" not in fresh and "| budgeted-hard | 0.50 | 2 | 84.50" in fresh and not figure.exists()
    assert "acc. % 84.50" in _study_line(readme.read_text(), "demo")


def test_kept_sections_keep_every_headline_row_their_replication_rows_and_their_own_figures(tmp_path):
    """Several README rows of one kept study come back in order; its replication rows join a fresh
    replication table; a figure of study 'a_b' is not taken for study 'a''s; a '## ' line inside
    a section does not split it."""
    def studies_file(names):
        path = tmp_path / "studies.yaml"
        path.write_text(yaml.safe_dump({"studies": [
            {"name": n, "question": f"Q {n}?", "config": "c.yaml", "seeds": [0, 1], "commands": [f"baa demo --out runs/{n}"],
             "figure": "accuracy_vs_speedup.png", "replicas": [f"runs/{n}_other"],
             "table": {"kind": "sweep", "methods": ["dense", "budgeted-hard"], "target": {"max_drop": 1.0}},
             "headline": [{"method": "budgeted-hard", "budget": 0.5}, {"method": "budgeted-hard", "budget": 0.25}]} for n in names]}))
        return path

    path = studies_file(["a", "a_b"])
    for name in ("a", "a_b"):
        (_run(tmp_path, name, _sweep_rows()) / "accuracy_vs_speedup.png").write_bytes(b"\x89PNG")
        _run(tmp_path, f"{name}_other", _sweep_rows(), processor="AMD EPYC")
    readme, out = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    write_studies_report(path, out, readme=readme, command=COMMAND)
    out.write_text(out.read_text().replace("Figure: `accuracy_vs_speedup.png` of `runs/a_b`.", "## not a heading\n\nFigure: `accuracy_vs_speedup.png` of `runs/a_b`."))
    first_rows = [line for line in readme.read_text().splitlines() if line.startswith("| [a_b](")]
    assert len(first_rows) == 2
    shutil.rmtree(tmp_path / "runs" / "a_b")  # a_b is gone; a (and both replicas) are still here
    shutil.rmtree(tmp_path / "runs" / "a_b_other")
    write_studies_report(path, out, readme=readme, command=COMMAND)
    text = out.read_text()
    kept = text.split("## a_b\n", 1)[1].split("\n## Replication\n", 1)[0]
    assert "## not a heading" in kept and "Kept from" in kept and "studies.yaml has changed" not in kept and "Figure: `acc" in kept
    assert [line for line in readme.read_text().splitlines() if line.startswith("| [a_b](")] == [
        row.replace("| budgeted-hard b =", "| kept from an earlier run: budgeted-hard b =").replace("| meets |", "| judged then: meets |")
        .replace("| FAILS:", "| judged then: FAILS:") for row in first_rows]
    replication = _section(text, "Replication")
    assert "`runs/a_other`" in replication and "`runs/a_b_other`" in replication
    assert (tmp_path / "docs" / "figures" / "a_b_accuracy_vs_speedup.png").is_file()
    assert (tmp_path / "docs" / "figures" / "a_accuracy_vs_speedup.png").is_file()


def _study_line(readme: str, name: str) -> str:
    return next(line for line in readme.splitlines() if line.startswith(f"| [{name}]("))


def test_runs_of_one_machine_replicate_nothing(tmp_path):
    """The replication table is for figures measured on more than one machine: a merged run whose
    parts all ran on its own machine adds no rows, fresh or kept from an earlier page."""
    studies = _studies(tmp_path)
    _run(tmp_path, "demo", _sweep_rows())
    _run(tmp_path, "demo_other", _sweep_rows(drop=0.01))  # the same machine as runs/demo
    out = tmp_path / "docs" / "results.md"
    write_studies_report(studies, out, command=COMMAND)
    assert "## Replication" not in out.read_text()
    old = out.read_text() + ("\n## Replication\n\nintro\n\n| study | row | measured | run directory | machine | target |\n|---|---|---|---|---|---|\n"
                             "| demo | method budgeted-hard, budget 0.5 | x | `runs/demo` | Intel Xeon, 2 CPUs | meets |\n"
                             "| demo | method budgeted-hard, budget 0.5 | y | `runs/p0` | Intel Xeon, 2 CPUs | meets |\n")
    out.write_text(old)
    shutil.rmtree(tmp_path / "runs")  # kept: its one-machine replication rows are not
    write_studies_report(studies, out, command=COMMAND)
    assert "Kept from" in _section(out.read_text(), "demo") and "## Replication" not in out.read_text()


def test_only_must_be_a_list_of_selectors(tmp_path):
    bad = tmp_path / "studies.yaml"
    for only in ({"method": "x"}, [], [{"budgt": 0.5}]):
        bad.write_text(yaml.safe_dump({"studies": [{"name": "x", "question": "q", "config": "c", "seeds": [0], "commands": ["baa demo --out runs/x"],
                                                    "table": {"kind": "sweep", "target": {"only": only, "max_drop": 1.0}}}]}))
        with pytest.raises(ReportError, match="'table.target.only' is a list of selectors"):
            load_studies(bad)


def test_a_recorded_host_tells_two_machines_of_one_cpu_model_apart(tmp_path):
    studies = _studies(tmp_path)
    for name, host in (("demo", "aaaa"), ("demo_other", "bbbb")):  # the same CPU model, two hosts
        run = _run(tmp_path, name, _sweep_rows())
        info = json.loads((run / "run_info.json").read_text())
        info["environment"]["host"] = host
        (run / "run_info.json").write_text(json.dumps(info))
    out = tmp_path / "docs" / "results.md"
    write_studies_report(studies, out, command=COMMAND)
    assert "`runs/demo_other`" in _section(out.read_text(), "Replication")


def test_a_run_without_a_host_beside_one_with_it_is_the_same_machine(tmp_path):
    """Older run directories record no host: a merged run (host recorded) and its parts (none) of
    one CPU model are one machine, and replicate nothing."""
    studies = _studies(tmp_path)
    run = _run(tmp_path, "demo", _sweep_rows())
    info = json.loads((run / "run_info.json").read_text())
    info["environment"]["host"] = "aaaa"
    (run / "run_info.json").write_text(json.dumps(info))
    _run(tmp_path, "demo_other", _sweep_rows(drop=0.01))  # no host: same CPU, so the same machine
    out = tmp_path / "docs" / "results.md"
    write_studies_report(studies, out, command=COMMAND)
    assert "## Replication" not in out.read_text()
