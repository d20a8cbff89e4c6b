import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed")
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast  # noqa: E402

from budgeted_attention.pipeline import Experiment, load_experiment_config  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _local_tiny_bert(folder: Path) -> None:
    """A randomly initialised tiny BERT and a WordPiece tokenizer saved like a hub checkpoint."""
    words = "war election minister treaty match goal team season shares profit market bank software chip internet phone news report the a of".split()
    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    BertTokenizerFast(tokenizer_object=backend).save_pretrained(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, max_position_embeddings=32)
    BertForSequenceClassification(config).save_pretrained(folder)


@pytest.mark.filterwarnings("ignore")
def test_bert_family_runs_every_method_through_the_runner(tmp_path):
    _local_tiny_bert(tmp_path / "bert")
    config = tmp_path / "bert.yaml"
    config.write_text(f"""
name: tiny-bert
seeds: [0]
budgets: [0.5, 1.0]
static_budgets: [0.5]
model_family: bert
pretrained: {{path: {tmp_path / "bert"}}}
data:
  source: ag_news
  train_file: {FIXTURES / "ag_news_train.csv"}
  test_file: {FIXTURES / "ag_news_test.csv"}
  max_len: 12
  val_fraction: 0.25
train: {{dense_steps: 3, budgeted_steps: 3, hard_steps: 2, recovery_steps: 1, batch_size: 8}}
bench: {{rounds: 1, min_run_time: 0.005}}
""")
    out = tmp_path / "run"
    Experiment(load_experiment_config(str(config)), out, progress=False, log=lambda *_: None).run()
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"dense", "dense-long", "budgeted", "budgeted-hard", "static", "static-soft", "posthoc",
                                           "posthoc-recovered", "posthoc-recovered-1ep"}
    hard = [r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5]
    assert hard[0]["heads_kept"] == 2 and "speedup" in hard[0] and "ideal_speedup" in hard[0]
    assert (out / "checkpoints" / "seed0" / "budgeted-hard.safetensors").is_file()

    from budgeted_attention.recipes.bench import run_bench

    result = run_bench(out, seed=0, budgets=[0.5], batch_sizes=[2], seq_lens=[8], threads=1, rounds=1,
                       min_run_time=0.005, json_path=str(tmp_path / "b.json"), progress=False, log=lambda *_: None)
    assert result["setting"]["library"] == "transformers" and result["setting"]["family"] == "bert"
    assert result["setting"]["dense_reference"].startswith("CompactBert at b = 1")
    row = result["rows"][0]
    assert row["heads_kept"] == 2 and row["library_speedup"] > 0 and row["speedup"] == row["dense_latency_ms"] / row["latency_ms"]
    assert not {"transformers_speedup", "lean_speedup", "sliced_speedup"} & set(row)  # the 0.1 aliases are gone
    assert "| dense ms | pruned ms | speedup | FLOP-ideal | speedup / ideal | vs transformers |" in (tmp_path / "b.md").read_text()

    # baa serve's engine serves a BERT run through the lean copy, with the module tree's answers.
    import torch  # noqa: PLC0415

    from budgeted_attention.hf.compact import CompactBert  # noqa: PLC0415
    from budgeted_attention.serving.config import ServeConfig  # noqa: PLC0415
    from budgeted_attention.serving.engine import Engine  # noqa: PLC0415

    from unittest.mock import patch  # noqa: PLC0415

    engine = Engine(out, ServeConfig(budgets=[0.5, 1.0], min_budget=0.5, warmup_batches=0, calibration_batch_sizes=[1]))
    assert isinstance(engine.sliced.lean, CompactBert)
    assert engine.runtime == "lean copy (CompactBert)" and engine.describe()["runtime"] == engine.runtime
    ids = engine.tokenize(["the minister won the election", "shares of the bank fell"])
    for budget in (0.5, 1.0):
        with patch.object(CompactBert, "forward", autospec=True, side_effect=CompactBert.forward) as spy:
            lean = engine.run(ids, budget)
        assert spy.call_count == 1
        input_ids, mask = engine.pad(ids)
        with torch.no_grad():
            module_tree = torch.softmax(engine.sliced.model(input_ids, mask), dim=-1)
        assert torch.allclose(lean, module_tree, atol=1e-5)
