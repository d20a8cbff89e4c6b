import json
import subprocess
import sys

import pytest

from budgeted_attention.cli import main


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "command"),
        (["demo", "--bogus"], "--bogus"),
        (["bench", "runs/definitely-missing"], "definitely-missing"),
        (["bench", "x", "--budgets", "0.5,1.5"], "1.5"),
        (["bench", "x", "--budgets", "nan"], "nan"),
        (["bench", "x", "--batch-sizes", "0"], "'0'"),
        (["demo", "--config", "no/such.yaml"], "no/such.yaml"),
        (["demo", "--quick", "--set", "train.lr=fast"], "train.lr"),
        (["demo", "--quick", "--set", "budgets=[0.0]"], "0.0"),
    ],
)
def test_misuse_exits_2_with_one_line(args, fragment, capsys):
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse errors exit directly
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("baa: error:"), err
    assert fragment in lines[0]


def test_console_script_misuse_has_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "budgeted_attention.cli", "bench", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_demo_quick_end_to_end_then_bench(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = _run(["demo", "--quick", "--no-progress", "--out", str(out)], capsys)
    assert code == 0 and "| method |" in stdout
    for name in ("config.yaml", "run_info.json", "results.json", "results.csv", "results.md", "accuracy_vs_cost.png"):
        assert (out / name).is_file(), name
    rows = json.loads((out / "results.json").read_text())["rows"]
    methods = {r["method"] for r in rows}
    assert {"dense", "budgeted", "budgeted-scratch", "budgeted-hard"} <= methods
    for row in rows:
        assert {"method", "budget", "seed", "accuracy", "estimated_cost"} <= set(row)
    hard = [r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5]
    assert hard and all({"heads_kept", "latency_ms", "speedup", "ideal_speedup"} <= set(r) for r in hard)
    assert (out / "checkpoints" / "seed0" / "budgeted-hard.safetensors").is_file()

    bench_json = tmp_path / "bench.json"
    code, stdout, _ = _run(
        ["bench", str(out), "--budgets", "0.5", "--batch-sizes", "1,2", "--seq-lens", "8",
         "--rounds", "1", "--min-run-time", "0.01", "--json", str(bench_json), "--no-progress"],
        capsys,
    )
    assert code == 0
    result = json.loads(bench_json.read_text())
    assert len(result["rows"]) == 2
    for row in result["rows"]:
        assert {"budget", "batch_size", "seq_len", "threads", "dense_latency_ms", "latency_ms", "speedup", "ideal_speedup"} <= set(row)
        assert row["threads"] == 1 and row["latency_ms"] > 0
    assert result["switch"]["switch_ms"] > 0
    assert bench_json.with_suffix(".png").is_file()
