"""The pipeline with ``task: lm``: a causal LM on BBC News characters through every stage."""

import json
import math

import pytest

from budgeted_attention.errors import ConfigError
from budgeted_attention.pipeline import Experiment, config_from_dict
from budgeted_attention.reporting.report import load_run, run_section

LM = {
    "name": "tiny-lm",
    "notes": "Reference: the paper reports X.",
    "task": "lm",
    "model_family": "decoder",
    "seeds": [0],
    "methods": ["dense", "budgeted", "budgeted-hard", "posthoc", "ladder"],
    "budgets": [0.5, 1.0],
    "ladder": [{"n_layers": 1, "d_ff": 0, "qk_norm": False, "name": "SAN 1L"}],
    "lm_data": {"tokenizer": "char", "seq_len": 24, "max_documents": 24},
    "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "max_len": 24, "dropout": 0.0, "qk_norm": True},
    "train": {"dense_steps": 6, "budgeted_steps": 6, "hard_steps": 4, "batch_size": 8, "eval_every": 3, "early_stopping_patience": 0},
    "bench": {"rounds": 1, "min_run_time": 0.005},
}


@pytest.mark.filterwarnings("ignore:skipped")
def test_lm_experiment_reports_loss_perplexity_and_speed(tmp_path):
    out = tmp_path / "run"
    Experiment(config_from_dict(LM), out, progress=False, log=lambda *_: None).run()
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"dense", "budgeted", "budgeted-hard", "posthoc", "ladder"}
    for row in rows:
        assert row["accuracy"] is None and row["loss"] > 0 and row["val_loss"] > 0
        assert math.isclose(row["perplexity"], math.exp(row["loss"]), rel_tol=1e-9)
    hard = [r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5]
    assert hard[0]["speedup"] > 0 and hard[0]["loss_before_adaptation"] > 0
    table = (out / "results.md").read_text()
    assert "test loss (nats)" in table and "test ppl." in table and "acc." not in table and "char tokens, blocks of" in table
    assert "| ladder (SAN 1L) |" in table and "vs dense (nats)" in table and "Reference: the paper reports X." in table
    assert (out / "accuracy_vs_budget.png").is_file() and (out / "tokenizer.json").is_file()
    assert (out / "training_curves.png").is_file()
    section = run_section(load_run(out), figures_dir=None, out=None)
    assert "Losses in nats per token" in section and "headline" not in section and "Reference: the paper reports X." in section


def test_task_and_family_must_agree():
    with pytest.raises(ConfigError, match="task 'lm' needs model_family 'decoder'"):
        config_from_dict({**LM, "model_family": "encoder"})
    with pytest.raises(ConfigError, match="task must be one of"):
        config_from_dict({**LM, "task": "translate"})
    with pytest.raises(ConfigError, match=r"ladder\[0\].name"):
        config_from_dict({**LM, "ladder": [{"n_layers": 1, "name": 3}]})


def test_baa_lm_refuses_a_classification_config(tmp_path, capsys):
    from budgeted_attention.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("task: classify\n")
    assert main(["lm", str(path)]) == 2
    assert "'baa lm' runs language models" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:skipped")
def test_meta_attention_run_reports_routing(tmp_path):
    cfg = {**LM, "methods": ["dense"], "model": {**LM["model"], "attention": "meta", "meta": {"window": 4}, "positions": "none", "max_len": 48}}
    out = tmp_path / "run"
    Experiment(config_from_dict(cfg), out, progress=False, log=lambda *_: None).run()
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    routing = row["routing"]
    assert 0 < routing["attention_flops_fraction"] and routing["hard_loss"] > 0
    assert sum(routing["expert_fractions"].values()) == pytest.approx(1.0)
    assert "## Routing (Meta-Attention, test split)" in (out / "results.md").read_text()
    assert "routing (Meta-Attention" in run_section(load_run(out), figures_dir=None, out=None)

    # Hard routing against full attention at a length the model never trained on (no position table).
    from budgeted_attention.recipes.bench_routing import run_bench_routing

    result = run_bench_routing(out, seed=None, seq_lens=[48], blocks=1, threads=1, rounds=1, min_run_time=0.005, progress=False, log=lambda *_: None)
    (bench,) = result["rows"]
    assert bench["seq_len"] == 48 and bench["hard_ms"] > 0 and bench["full_ms"] > 0
    assert 0 < bench["attention_flops_fraction"] and bench["loss_change"] == pytest.approx(bench["hard_loss"] - bench["full_loss"])
    assert "hard routing vs full attention at long sequences" in run_section(load_run(out), figures_dir=None, out=None)


def test_bench_routing_refuses_a_run_without_meta_attention(tmp_path):
    from budgeted_attention.cli import main

    out = tmp_path / "run"
    Experiment(config_from_dict({**LM, "methods": ["dense"]}), out, progress=False, log=lambda *_: None).run()
    assert main(["bench-routing", str(out)]) == 2
