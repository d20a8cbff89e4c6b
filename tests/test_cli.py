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
        (["experiment", "configs/synthetic.yaml", "--threads", "0"], "'0'"),
        (["experiment", "configs/synthetic.yaml", "--retime", "--finished-only", "--out", "runs/never-written"], "--retime"),
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
    assert methods == {"dense", "budgeted", "budgeted-hard"}
    for row in rows:
        assert {"method", "budget", "seed", "accuracy", "val_accuracy", "cost", "cost_kind", "steps"} <= set(row)
    assert {r["budget"] for r in rows if r["method"] == "budgeted"} == {0.25, 0.5, 0.75, 0.99, 1.0}
    hard = [r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5]
    assert hard and all({"heads_kept", "latency_ms", "speedup", "ideal_speedup"} <= set(r) for r in hard)
    assert (out / "checkpoints" / "seed0" / "budgeted-hard.safetensors").is_file()

    bench_json = tmp_path / "bench.json"
    code, stdout, _ = _run(
        ["bench", str(out), "--budgets", "0.5", "--batch-sizes", "1,2", "--seq-lens", "8", "--lengths",
         "--rounds", "1", "--min-run-time", "0.01", "--json", str(bench_json), "--no-progress"],
        capsys,
    )
    assert code == 0
    result = json.loads(bench_json.read_text())
    assert len(result["rows"]) == 4 and {r["input"] for r in result["rows"]} == {"random", "lengths"}
    # without --seq-lens: 128 tokens, or the model's max_len (32 here) when shorter
    code, _, _ = _run(["bench", str(out), "--budgets", "0.5", "--rounds", "1", "--min-run-time", "0.01", "--json", str(tmp_path / "d.json"),
                       "--no-progress"], capsys)
    assert code == 0 and {r["seq_len"] for r in json.loads((tmp_path / "d.json").read_text())["rows"]} == {32}
    for row in result["rows"]:
        assert {"budget", "batch_size", "seq_len", "threads", "dense_latency_ms", "latency_ms", "speedup", "ideal_speedup"} <= set(row)
        assert row["threads"] == 1 and row["latency_ms"] > 0
    assert result["switch"]["switch_ms"] > 0
    assert result["setting"]["compile"] is False and "torch.compile" not in result["setting"]["timer"]  # eager, and said so
    assert bench_json.with_suffix(".png").is_file()


# --------------------------------------------------------------------------- one-line errors


def _one_error_line(code, err):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("baa: error:") and "Traceback" not in err, err
    return lines[0]


def _fake_run(tmp_path):
    """A run directory with a tiny budgeted-hard checkpoint (no training)."""
    import torch

    from budgeted_attention.checkpoint import save_model
    from budgeted_attention.model.config import ModelConfig
    from budgeted_attention.model.transformer import EncoderClassifier
    from budgeted_attention.model.gates import UnitGates
    from budgeted_attention.pruning.selection import Ranking

    torch.manual_seed(0)
    model = EncoderClassifier(ModelConfig(vocab_size=20, n_classes=2, max_len=8, d_model=16, n_layers=2, n_heads=2, d_ff=16))
    ranking = Ranking.from_scores(UnitGates(torch.arange(4.0).view(2, 2)))
    run = tmp_path / "run"
    save_model(model, run / "checkpoints" / "seed0" / "budgeted-hard", method="budgeted-hard", seed=0, ranking=ranking.to_dict())
    return run


_FAST = ["--budgets", "0.5", "--batch-sizes", "1", "--seq-lens", "8", "--rounds", "1", "--min-run-time", "0.001", "--no-progress"]


def test_output_below_a_regular_file_is_one_line(tmp_path, capsys):
    run = _fake_run(tmp_path)
    blocker = tmp_path / "plain.txt"
    blocker.write_text("not a directory\n")
    target = blocker / "below" / "x.json"
    code, _, err = _run(["bench", str(run), "--json", str(target), *_FAST], capsys)
    line = _one_error_line(code, err)
    assert str(blocker) in line


def test_demo_out_below_a_regular_file_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "plain.txt"
    blocker.write_text("x")
    code, _, err = _run(["demo", "--quick", "--no-progress", "--out", str(blocker / "run")], capsys)
    assert str(blocker) in _one_error_line(code, err)


def test_json_onto_a_directory_is_one_line(tmp_path, capsys):
    run = _fake_run(tmp_path)
    target = tmp_path / "a_directory.json"
    target.mkdir()
    code, _, err = _run(["bench", str(run), "--json", str(target), *_FAST], capsys)
    assert "a_directory.json" in _one_error_line(code, err)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a budgeted_attention/2 checkpoint"),
        ('{"format": "budgeted_attention.encoder/1", "ranking": {"n_layers": 2}}', "not a budgeted_attention/2 checkpoint"),
        ('{"format": "budgeted_attention/2", "family": "encoder", "architecture": {}, "ranking": {"n_layers": 2}}',
         "malformed head ranking"),
        ('{"format": "budgeted_attention/2", "family": "encoder", "architecture": {}, "ranking": [1]}', "malformed head ranking"),
        ('{"format": "budgeted_attention/2", "family": "encoder", "architecture": {}, '
         '"ranking": {"order": 5, "n_layers": 2, "n_heads": 2, "min_one_per_layer": true}}', "malformed head ranking"),
        ('{"format": "budgeted_attention/2", "family": "encoder", "architecture": {}, '
         '"ranking": {"scope": "all", "order": [["head", 0, 0]], "n_layers": 1, "n_heads": 1, "n_groups": 1, '
         '"head_cost": 1, "group_cost": 1, "min_one_per_layer": true}}', "malformed head ranking"),
    ],
)
def test_malformed_checkpoint_is_one_line(tmp_path, capsys, content, fragment):
    run = _fake_run(tmp_path)
    (run / "checkpoints" / "seed0" / "budgeted-hard.json").write_text(content)
    code, _, err = _run(["bench", str(run), *_FAST], capsys)
    line = _one_error_line(code, err)
    assert fragment in line and "budgeted-hard.json" in line


def test_corrupted_weights_are_one_line(tmp_path, capsys):
    run = _fake_run(tmp_path)
    weights = run / "checkpoints" / "seed0" / "budgeted-hard.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    code, _, err = _run(["bench", str(run), *_FAST], capsys)
    assert "budgeted-hard.safetensors" in _one_error_line(code, err)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "fast"])
def test_min_run_time_is_checked_at_parse_time(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "x", f"--min-run-time={value}"])
    assert exit_.value.code == 2
    line = _one_error_line(2, capsys.readouterr().err)
    assert "--min-run-time" in line and repr(value) in line


@pytest.mark.parametrize(
    "override, fragment",
    [("bench.batch_sizes=[]", "bench.batch_sizes"), ("bench.threads=0", "bench.threads"),
     ("bench.budgets=[.nan]", "nan"), ("train.grad_clip=.inf", "train.grad_clip")],
)
def test_bad_overrides_fail_before_any_work(override, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _run(["demo", "--quick", "--no-progress", "--out", str(out), "--set", override], capsys)
    assert fragment in _one_error_line(code, err)
    assert not out.exists()


def test_permission_error_is_one_line(tmp_path, capsys, monkeypatch):
    import budgeted_attention.recipes.demo as demo

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "locked"))

    monkeypatch.setattr(demo, "run_demo", denied)
    code, _, err = _run(["demo", "--quick", "--no-progress", "--out", str(tmp_path / "locked")], capsys)
    assert _one_error_line(code, err) == f"baa: error: Permission denied: '{tmp_path / 'locked'}'"


def test_disk_full_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    import budgeted_attention.recipes.demo as demo

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(demo, "run_demo", full)
    code, _, err = _run(["demo", "--quick", "--no-progress"], capsys)
    assert "No space left on device" in _one_error_line(code, err)


def test_keyboard_interrupt_is_130(capsys, monkeypatch):
    import budgeted_attention.recipes.demo as demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_demo", interrupted)
    code, _, err = _run(["demo", "--quick", "--no-progress"], capsys)
    assert code == 130 and err.strip() == "baa: interrupted"


@pytest.mark.parametrize(("name", "hint"), [("onnxruntime", "'.[serve]'"), ("transformers", "'.[hf]'"), ("some_other_package", None)])
def test_a_missing_extra_is_one_line_naming_it(name, hint, capsys, monkeypatch):
    import budgeted_attention.recipes.demo as demo

    def missing(*args, **kwargs):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(demo, "run_demo", missing)
    code, _, err = _run(["demo", "--quick", "--no-progress"], capsys)
    line = _one_error_line(code, err)
    assert f"needs the optional dependency {name!r}" in line and (hint in line if hint else "pip install" not in line)


def test_a_broken_import_of_our_own_is_not_called_a_missing_extra(capsys, monkeypatch):
    import budgeted_attention.recipes.demo as demo

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'x'", name="budgeted_attention.pipeline.methods.base")

    monkeypatch.setattr(demo, "run_demo", broken)
    with pytest.raises(ImportError, match="cannot import name"):
        main(["demo", "--quick", "--no-progress"])


def test_serve_refuses_bad_runs_and_settings_before_starting(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--set", "max_batch_size=0"]) == 2
    assert "serve.max_batch_size" in capsys.readouterr().err


def test_serve_onnx_backend_needs_exported_graphs(tiny_run, capsys):
    assert main(["serve", str(tiny_run), "--backend", "onnxruntime", "--onnx-dir", str(tiny_run / "none")]) == 2
    assert "baa export" in capsys.readouterr().err


def test_threads_sets_torch_threads_for_the_run(monkeypatch):
    import torch

    from budgeted_attention import cli

    seen = {}
    monkeypatch.setattr("budgeted_attention.pipeline.run_experiment", lambda *a, **k: seen.setdefault("threads", torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        assert cli.main(["experiment", "configs/synthetic.yaml", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen["threads"] == 1
