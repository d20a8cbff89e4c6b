"""The hf-decoder-classifier family: a transformers decoder pooled at its last real token, equal
to transformers' own ``*ForSequenceClassification``, through ``baa experiment`` on a tiny Llama
folder (its own tokenizer), the engine of ``baa serve`` and a pruned reload."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from budgeted_attention import checkpoint  # noqa: E402
from budgeted_attention.cli import main  # noqa: E402
from budgeted_attention.hf.decoder_classifier import DecoderClassifierRunner, GatedDecoderClassifier, last_real_positions  # noqa: E402
from budgeted_attention.pruning.selection import Ranking  # noqa: E402
from budgeted_attention.pruning.surgery import prune_to_budget  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _llama(pad_id: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, intermediate_size=64,
        max_position_embeddings=32, pad_token_id=pad_id, attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_gemma3_logits_equal_transformers_gemma3_sequence_classification():
    """Gemma 3's sliding windows (window 4 < 10 tokens), QK-norm, sandwich norms and scaled embeddings."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8, intermediate_size=64,
        max_position_embeddings=32, sliding_window=4, pad_token_id=0, layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa",
    )
    hf = transformers.Gemma3ForCausalLM(config).eval()
    model = GatedDecoderClassifier(copy.deepcopy(hf), 3).eval()
    labelled = copy.deepcopy(hf.config)
    labelled.num_labels = 3
    reference = transformers.Gemma3TextForSequenceClassification(labelled).eval()
    weights = {k: v for k, v in hf.state_dict().items() if not k.startswith("lm_head")} | {"score.weight": model.score.weight.data}
    missing, unexpected = reference.load_state_dict(weights, strict=False)
    assert not missing and not unexpected
    ids = torch.randint(1, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 0, 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), reference(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)


def test_last_real_positions_either_padding_side():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert last_real_positions(mask, 4, 5, torch.device("cpu")).tolist() == [2, 4, 4, 0]
    assert last_real_positions(None, 2, 5, torch.device("cpu")).tolist() == [4, 4]


def test_logits_equal_transformers_sequence_classification_with_the_same_weights():
    hf = _llama()
    model = GatedDecoderClassifier(copy.deepcopy(hf), 3).eval()
    config = copy.deepcopy(hf.config)
    config.num_labels = 3
    reference = transformers.LlamaForSequenceClassification(config).eval()
    reference.model.load_state_dict(hf.model.state_dict())
    reference.score.weight.data.copy_(model.score.weight)
    ids = torch.randint(1, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 0, 0  # right padding with the pad id: transformers pools the last non-pad token
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(model(ids, mask), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.library_references()["transformers"](ids, mask), expected, atol=1e-5, rtol=1e-5)
        # right padding changes nothing for the real tokens
        torch.testing.assert_close(model(ids[1:2, :6])[0], model(ids, mask)[1], atol=1e-5, rtol=1e-5)
    assert not any("lm_head" in k for k in model.state_dict())  # the vocabulary projection is dropped
    assert model.cost_model(10).fixed_fraction() < 1e-3  # one pooled position scored, nothing else fixed


def test_a_removed_kv_group_shrinks_the_classifier_and_it_reloads(tmp_path):
    model = GatedDecoderClassifier(_llama(), 4, ffn_group_size=16).eval()
    ids = torch.randint(1, 40, (2, 8), generator=torch.Generator().manual_seed(2))
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(8))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.3)
    assert sum(pruned.kv_heads_per_layer()) < 4
    with torch.no_grad():
        torch.testing.assert_close(pruned(ids), model(ids, gates=ranking.masks(0.3)), atol=1e-5, rtol=1e-5)
        runner = pruned.inference_module()
        assert isinstance(runner, DecoderClassifierRunner)
        torch.testing.assert_close(runner(ids), pruned(ids), atol=1e-5, rtol=1e-5)
    loaded, _ = checkpoint.load_model(checkpoint.save_model(pruned, tmp_path / "m.safetensors"))
    assert loaded.num_labels == 4 and loaded.kv_heads_per_layer() == pruned.kv_heads_per_layer()
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids), pruned(ids))
    with pytest.raises(Exception, match="classifies"):
        runner.generate(ids, 2)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A Llama decoder (8 query heads in 2 K/V groups) with a word-level tokenizer that pads, as a transformers folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    folder = tmp_path_factory.mktemp("tiny_llama_cls")
    words = "war election minister treaty match goal team season shares profit market bank software chip internet phone news report the a of".split()
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=32, pad_token_id=0, eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.filterwarnings("ignore")
def test_baa_experiment_classifies_with_a_transformers_decoder_and_serves_it(tiny_folder, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"""
name: tiny-decoder-cls
seeds: [0]
model_family: hf-decoder-classifier
pretrained: {{path: {tiny_folder}}}
methods: [dense, budgeted-hard, posthoc-recovered]
budgets: [0.5, 1.0]
budget_scope: all
ffn_group_size: 16
data:
  source: ag_news
  train_file: {FIXTURES / "ag_news_train.csv"}
  test_file: {FIXTURES / "ag_news_test.csv"}
  max_len: 12
  val_fraction: 0.25
train: {{dense_steps: 3, budgeted_steps: 3, hard_steps: 2, batch_size: 8}}
bench: {{batch_sizes: [1], seq_lens: [12], rounds: 1, min_run_time: 0.005}}
""")
    out = tmp_path / "run"
    assert main(["experiment", str(config), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"dense", "budgeted-hard", "posthoc-recovered"}
    hard = next(r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5)
    assert 0.0 <= hard["accuracy"] <= 1.0 and hard["speedup"] > 0 and hard["ideal_speedup"] > 1.0

    from budgeted_attention.serving.config import ServeConfig  # noqa: PLC0415
    from budgeted_attention.serving.engine import Engine  # noqa: PLC0415

    engine = Engine(out, ServeConfig(budgets=[0.5, 1.0], min_budget=0.5, warmup_batches=0, calibration_batch_sizes=[1]))
    assert isinstance(engine.sliced.lean, DecoderClassifierRunner)
    ids = engine.tokenize(["the minister won the election", "shares of the bank fell"])
    for budget in (0.5, 1.0):
        served = engine.classify(["the minister won the election", "shares of the bank fell"], budget).probabilities
        input_ids, mask = engine.pad(ids)
        with torch.no_grad():
            module_tree = torch.softmax(engine.sliced.model(input_ids, mask), dim=-1)
        assert served.shape == (2, 4) and torch.allclose(served, module_tree, atol=1e-5)


def test_a_config_with_the_lm_task_is_refused_for_the_classifier_family(tiny_folder, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"task: lm\nmodel_family: hf-decoder-classifier\npretrained: {{path: {tiny_folder}}}\n")
    assert main(["lm", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hf-decoder-classifier" in err and "Traceback" not in err
