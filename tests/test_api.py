"""The public API at the package top, and the README's example run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import budgeted_attention as baa
from budgeted_attention.data.dataset import Split
from budgeted_attention.errors import BAAError, ConfigError
from conftest import tiny_config

ROOT = Path(__file__).parent.parent
LEGACY_RUN = Path(__file__).parent / "fixtures" / "legacy" / "run"


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- api-example:begin -->\n```python\n(.*?)```\n<!-- api-example:end -->", text, re.S)
    assert match, "README.md lost its api-example block"
    return match.group(1)


def test_readme_example_is_short_and_runs(tmp_path, monkeypatch):
    code = _readme_example()
    assert len(code.strip().splitlines()) <= 10
    (tmp_path / "runs").mkdir()
    shutil.copytree(LEGACY_RUN, tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}  # the block defines its own inputs: it runs as pasted
    with torch.no_grad():
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert (tmp_path / "small.safetensors").is_file() and (tmp_path / "small.json").is_file()
    assert scope["logits"].shape == (2, 4)
    assert scope["rows"] and all(row["speedup"] > 0 for row in scope["rows"])
    reloaded = baa.load(tmp_path / "small.safetensors")
    assert reloaded.model.heads_per_layer == scope["small"].heads_per_layer


def test_import_is_light():
    """`import budgeted_attention` does not import torch: the API loads on first use."""
    code = "import sys, budgeted_attention; assert 'torch' not in sys.modules; budgeted_attention.load; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        baa.nope  # noqa: B018


def test_train_prune_save_load_round_trip(tmp_path):
    from budgeted_attention.model.transformer import EncoderClassifier
    from budgeted_attention.training.config import TrainConfig

    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(ffn_group_size=8))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 29, (32, 10), generator=gen)
    split = Split(ids, torch.ones_like(ids), torch.randint(0, 3, (32,), generator=gen))
    cfg = TrainConfig(batch_size=8, dense_steps=2, budgeted_steps=2, hard_steps=2)
    bm = baa.train(model, split, config=cfg, progress=False)
    assert bm.ranking is not None
    small = bm.prune(0.5)
    assert small.is_pruned
    baa.save(bm, tmp_path / "hard.safetensors")
    again = baa.load(tmp_path / "hard.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(again.prune(0.5)(ids[:2]), small(ids[:2]))
    with pytest.raises(BAAError, match="budget"):
        bm.prune(1.5)
    with pytest.raises(ConfigError, match="stages"):
        baa.train(model, split, stages=["warmup"])


def test_soft_only_checkpoint_refuses_prune(tmp_path):
    from budgeted_attention.model.transformer import EncoderClassifier

    path = baa.save(EncoderClassifier(tiny_config()), tmp_path / "soft.safetensors")
    with pytest.raises(ConfigError, match="no unit ranking"):
        baa.load(path).prune(0.5)


def test_wrap_a_transformers_model():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24, num_labels=2)
    model = baa.wrap(transformers.BertForSequenceClassification(cfg))
    assert model.family == "bert"
    with pytest.raises(ConfigError, match="num_labels"):
        baa.wrap("some/folder")
