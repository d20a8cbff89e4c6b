import json
from pathlib import Path

import pytest

from budgeted_attention.errors import ConfigError
from budgeted_attention.recipes import experiment as experiment_module
from budgeted_attention.recipes.experiment import Experiment, load_experiment_config

FIXTURES = Path(__file__).parent.parent / "fixtures"
LATENCY_FIELDS = {"latency_ms", "dense_latency_ms", "speedup", "bench_batch_size", "bench_seq_len", "threads"}

CONFIG = f"""
name: tiny
seeds: [0, 1]
budgets: [0.5, 1.0]
static_budgets: [0.5]
data:
  source: ag_news
  train_file: {FIXTURES / "ag_news_train.csv"}
  test_file: {FIXTURES / "ag_news_test.csv"}
  max_len: 12
  min_frequency: 1
  val_fraction: 0.25
model: {{d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32, max_len: 16, dropout: 0.0}}
train: {{dense_steps: 6, budgeted_steps: 6, hard_steps: 4, recovery_steps: 2, batch_size: 8}}
bench: {{rounds: 1, min_run_time: 0.005}}
"""


def _config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    return load_experiment_config(str(path))


def _accuracy_rows(out: Path):
    rows = json.loads((out / "results.json").read_text())["rows"]
    return [{k: v for k, v in row.items() if k not in LATENCY_FIELDS} for row in rows]


@pytest.mark.filterwarnings("ignore:skipped")
def test_interrupted_run_resumes_to_identical_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    Experiment(cfg, tmp_path / "straight", progress=False, log=lambda *_: None).run()

    original = Experiment._static
    calls = {"n": 0}

    def crash_once(self, seed, budget):
        calls["n"] += 1
        if calls["n"] == 2:  # seed 1's static unit: seed 0's units are finished by then
            raise KeyboardInterrupt
        return original(self, seed, budget)

    monkeypatch.setattr(Experiment, "_static", crash_once)
    with pytest.raises(KeyboardInterrupt):
        Experiment(cfg, tmp_path / "resumed", progress=False, log=lambda *_: None).run()
    assert not (tmp_path / "resumed" / "results.json").exists()
    finished = sorted(p.name for p in (tmp_path / "resumed" / "units" / "seed0").glob("*.json"))
    assert "dense.json" in finished and "static-b0.5.json" in finished

    monkeypatch.setattr(Experiment, "_static", original)
    messages = []
    Experiment(cfg, tmp_path / "resumed", progress=False, log=messages.append).run()
    assert any("resuming" in str(m) for m in messages)
    assert _accuracy_rows(tmp_path / "straight") == _accuracy_rows(tmp_path / "resumed")

    methods = {r["method"] for r in _accuracy_rows(tmp_path / "resumed")}
    assert methods == {"dense", "budgeted", "budgeted-hard", "static", "posthoc", "posthoc-recovered"}
    for name in ("results.csv", "results.md", "accuracy_vs_budget.png", "accuracy_vs_speedup.png", "tokenizer.json", "config.yaml"):
        assert (tmp_path / "resumed" / name).is_file()


@pytest.mark.filterwarnings("ignore:skipped")
def test_refuses_to_resume_with_another_config(tmp_path):
    cfg = _config(tmp_path)
    cfg.methods = ["dense"]
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    cfg.train.dense_steps = 7
    with pytest.raises(ConfigError, match="different configuration"):
        Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)


def test_config_errors_name_the_bad_value(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("methods: [dense, magic]\n")
    with pytest.raises(ConfigError, match="magic"):
        load_experiment_config(str(path))
    path.write_text("budgets: [0.5, 2]\n")
    with pytest.raises(ConfigError, match="2"):
        load_experiment_config(str(path))


def test_shipped_configs_parse():
    root = Path(experiment_module.__file__).parents[3] / "configs"
    for name in ("synthetic", "ag_news", "dbpedia14", "bbc_short", "bbc_news", "minilm_bbc_short", "bert_mini_ag_news", "bert_mini_dbpedia14"):
        cfg = load_experiment_config(str(root / f"{name}.yaml"))
        assert cfg.name
