"""`baa lm` with the hf-decoder family: a tiny Llama folder (its own tokenizer) through the LM
pipeline — dense fine-tune, budgeted training, hard adaptation, post-hoc pruning with recovery,
bench — as configs/gemma_bbc_lm.yaml runs the real Gemma 3 270M."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import budgeted_attention as baa

transformers = pytest.importorskip("transformers")

from budgeted_attention.checkpoint import load_model  # noqa: E402
from budgeted_attention.cli import main  # noqa: E402
from budgeted_attention.data.lm import LMDataConfig, load_documents, make_lm_splits, train_lm_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A Llama causal LM (8 query heads in 2 K/V groups) with a character tokenizer, saved as a transformers folder."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    backend = train_lm_tokenizer(load_documents(LMDataConfig(max_documents=40)), "char", 260)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eod>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _config(folder, **overrides) -> dict:
    return {
        "name": "tiny-hf-lm", "task": "lm", "model_family": "hf-decoder", "seeds": [0],
        "methods": ["dense", "budgeted-hard", "posthoc-recovered"], "budgets": [0.5, 1.0],
        "budget_scope": "all", "ffn_group_size": 16,
        "pretrained": {"path": str(folder)},
        "lm_data": {"seq_len": 24, "max_documents": 24},
        "train": {"dense_steps": 3, "budgeted_steps": 3, "hard_steps": 2, "batch_size": 4, "eval_batch_size": 16},
        "bench": {"batch_sizes": [1], "seq_lens": [24], "rounds": 1, "min_run_time": 0.005},
        **overrides,
    }


@pytest.mark.filterwarnings("ignore")
def test_baa_lm_runs_a_transformers_decoder_and_its_pruned_checkpoint_generates(tiny_folder, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(tiny_folder)))
    out = tmp_path / "run"
    assert main(["lm", str(path), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"dense", "budgeted-hard", "posthoc-recovered"}
    assert all(r["loss"] > 0 and r["val_loss"] > 0 for r in rows)
    hard = next(r for r in rows if r["method"] == "budgeted-hard" and r["budget"] == 0.5)
    assert hard["speedup"] > 0
    tokenizer = json.loads((out / "tokenizer.json").read_text())  # the model's own tokenizer, kept with the run
    assert "<eod>" in tokenizer["model"]["vocab"]
    assert "(the model's own tokens, blocks of" in (out / "results.md").read_text()
    small = baa.load(out).prune(0.5)  # as docs/getting-started.md shows
    assert small.is_pruned and small.kv_heads_per_layer() and load_model(next(out.glob("checkpoints/seed0/budgeted-hard.json")))
    ids = torch.randint(3, 40, (1, 5))
    assert small.inference_module().generate(ids, 4).shape == (1, 9)
    # resumable: a second run finds every unit done
    assert main(["lm", str(path), "--out", str(out), "--no-progress"]) == 0


def test_a_missing_checkpoint_fails_before_any_work(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path / "nowhere")))
    assert main(["lm", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_tokenizer_that_adds_a_bos_starts_every_lm_block_with_it(tmp_path):
    """As Gemma's and Llama's tokenizers do; the tiny folder above adds none (its blocks are bare)."""
    from tokenizers import processors

    from budgeted_attention.model.config import ModelConfig
    from budgeted_attention.pipeline.builders import HFDecoderBuilder, PretrainedConfig

    backend = train_lm_tokenizer(load_documents(LMDataConfig(max_documents=40)), "char", 260)
    backend.add_special_tokens(["<bos>"])
    bos = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eod>", pad_token="<pad>", unk_token="<unk>",
    )
    tokenizer.save_pretrained(tmp_path)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, max_position_embeddings=64, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    lm_tokenizer = HFDecoderBuilder(ModelConfig(), PretrainedConfig(str(tmp_path))).pretrained_tokenizer()
    assert lm_tokenizer.prefix == (bos,)
    splits = make_lm_splits(LMDataConfig(seq_len=16, max_documents=24), pretrained=lm_tokenizer)
    assert bool((splits.train.input_ids[:, 0] == bos).all()) and not bool((splits.train.input_ids[:, 1:] == bos).any())


def test_lm_runs_of_pretrained_decoders_are_stamped_with_their_block_format(tiny_folder, monkeypatch):
    """A run directory made while the blocks started bare has another digest: refused, not resumed on other data."""
    from budgeted_attention.pipeline import config_digest, config_from_dict, unit_config_digest
    from budgeted_attention.pipeline import config as config_module

    cfg = config_from_dict(_config(tiny_folder))
    stamped = config_digest(cfg), unit_config_digest(cfg)
    monkeypatch.setattr(config_module, "families_with", lambda capability: ())  # the digest as before the BOS blocks
    bare = config_digest(cfg), unit_config_digest(cfg)
    assert stamped[0] != bare[0] and stamped[1] != bare[1]
