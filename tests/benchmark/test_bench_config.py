"""BenchConfig validates every value on construction (unique basename: tests/ has no __init__.py)."""

import math

import pytest
import torch

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.config import from_dict, load_yaml
from budgeted_attention.errors import ConfigError


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("batch_sizes", [], "bench.batch_sizes"),
        ("batch_sizes", [1, 0], "bench.batch_sizes[1]"),
        ("batch_sizes", [True], "bench.batch_sizes[0]"),
        ("seq_lens", [-8], "bench.seq_lens[0]"),
        ("threads", 0, "bench.threads"),
        ("rounds", 0, "bench.rounds"),
        ("min_run_time", 0.0, "bench.min_run_time"),
        ("min_run_time", math.nan, "bench.min_run_time"),
        ("min_run_time", math.inf, "bench.min_run_time"),
        ("budgets", [0.5, math.nan], "bench.budgets[1]"),
        ("budgets", [0.0], "bench.budgets[0]"),
        ("budgets", [1.5], "bench.budgets[0]"),
        ("include_sliced", 1, "bench.include_sliced"),
    ],
)
def test_bad_value_is_named(key, value, fragment):
    with pytest.raises(ConfigError) as info:
        BenchConfig(**{key: value})
    assert fragment in str(info.value)


def test_empty_seq_lens_and_budgets_mean_defaults():
    cfg = BenchConfig(budgets=[], seq_lens=[])
    assert cfg.budgets == [] and cfg.seq_lens == []


@pytest.mark.parametrize(
    "text, fragment",
    [("batch_sizes: []", "bench.batch_sizes"), ("threads: 0", "bench.threads"),
     ("budgets: [0.5, .nan]", "nan"), ("min_run_time: .inf", "bench.min_run_time")],
)
def test_bad_yaml_is_rejected(tmp_path, text, fragment):
    path = tmp_path / "b.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[")):
        from_dict(BenchConfig, load_yaml(path), "bench")


def test_yaml_exponent_float(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("min_run_time: 5e-2\nbudgets: [2.5e-1, 5e-1]\n")
    cfg = from_dict(BenchConfig, load_yaml(path), "bench")
    assert cfg.min_run_time == 0.05 and cfg.budgets == [0.25, 0.5]


def test_gpu_settings_are_checked():
    from budgeted_attention.benchmark.config import BenchConfig
    from budgeted_attention.errors import ConfigError

    with pytest.raises(ConfigError, match="bench.device"):
        BenchConfig(device="tpu")
    with pytest.raises(ConfigError, match="cuda_graphs"):
        BenchConfig(cuda_graphs=True)
    with pytest.raises(ConfigError, match="onnx"):
        BenchConfig(onnx=True, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when no GPU is present")
def test_cuda_bench_without_a_gpu_fails_with_one_line(tiny_run, capsys):
    from budgeted_attention.cli import main

    assert main(["bench", str(tiny_run), "--device", "cuda", "--seq-lens", "8", "--no-progress"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_bench_times_every_model_with_events_and_graphs(tiny_run, tmp_path):
    from budgeted_attention.recipes.bench import run_bench

    for graphs in (False, True):
        result = run_bench(tiny_run, seed=0, budgets=[0.5], batch_sizes=[1, 64], seq_lens=[8], threads=1, rounds=2,
                           min_run_time=0.01, json_path=str(tmp_path / f"b{graphs}.json"), device="cuda", cuda_graphs=graphs,
                           progress=False, log=lambda *_: None)
        assert result["setting"]["device"] == "cuda" and all(r["latency_ms"] > 0 for r in result["rows"])
