"""Supported Hugging Face encoder families and checked loading of their pretrained weights.

The budget gates replace an encoder's self-attention module, so only families whose
self-attention has BERT's layout are supported: separate ``query``/``key``/``value``
``nn.Linear`` layers, then ``attention.output.dense``, with the attributes ``dropout``,
``attention_head_size``, ``num_attention_heads``, ``scaling`` and the call
``forward(hidden_states, attention_mask=None, cache=None, **kwargs) -> (output, weights)``.
In transformers 5 ``BertSelfAttention``, ``RobertaSelfAttention``, ``XLMRobertaSelfAttention``
and ``ElectraSelfAttention`` are identical copies (checked in the installed sources);
DistilBERT (``q_lin``/``k_lin``/``v_lin``/``out_lin``), GPT-2 (fused ``c_attn``) and others
are not, and are refused with :class:`~budgeted_attention.errors.CheckpointError`.

:func:`load_pretrained_classifier` never returns a model with silently random encoder
weights: every weight other than the classification head must come from the checkpoint
with the shape the config asks for. Checkpoint weights that the classifier does not use
are accepted only when they belong to a known pretraining head (BERT's ``cls.``, RoBERTa's
``lm_head.``, ELECTRA's ``discriminator_predictions.``/``generator_*``) or to a pooler that
the family's classifier does not have (RoBERTa); they are reported, never dropped silently.

The accessors (:func:`encoder_layers`, :func:`self_attention`, ...) are written once for all
families so that code installing gates does not hard-code ``model.bert``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from budgeted_attention.errors import CheckpointError


@dataclass(frozen=True)
class Architecture:
    """What this library needs to know about one supported transformers model type."""

    model_type: str
    classifier_class: str  # name of the ForSequenceClassification class in ``transformers``
    base_attr: str  # attribute holding the base model (also transformers' ``base_model_prefix``)
    head_prefixes: tuple[str, ...]  # state-dict keys (model naming) of the classification head
    ignorable_prefixes: tuple[str, ...]  # checkpoint weights the classifier does not use (base prefix stripped)

    def classifier(self) -> type:
        import transformers  # noqa: PLC0415 - optional dependency

        return getattr(transformers, self.classifier_class)


_ROBERTA_HEAD = ("classifier.dense.", "classifier.out_proj.")

ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        "bert", "BertForSequenceClassification", "bert",
        # The pooler feeds only the classifier: a checkpoint without it (BertModel saved with
        # add_pooling_layer=False) gets a new one, trained with the head.
        head_prefixes=("classifier.", "bert.pooler."),
        ignorable_prefixes=("cls.",),  # BertForPreTraining / BertForMaskedLM heads
    ),
    "electra": Architecture(
        "electra", "ElectraForSequenceClassification", "electra",
        head_prefixes=_ROBERTA_HEAD,
        ignorable_prefixes=("discriminator_predictions.", "generator_predictions.", "generator_lm_head."),
    ),
    "roberta": Architecture(
        "roberta", "RobertaForSequenceClassification", "roberta",
        head_prefixes=_ROBERTA_HEAD,
        ignorable_prefixes=("lm_head.", "pooler."),  # the classifier is built without a pooler
    ),
    "xlm-roberta": Architecture(
        "xlm-roberta", "XLMRobertaForSequenceClassification", "roberta",
        head_prefixes=_ROBERTA_HEAD,
        ignorable_prefixes=("lm_head.", "pooler."),
    ),
}

SUPPORTED = tuple(sorted(ARCHITECTURES))


def _unsupported(found: object) -> CheckpointError:
    return CheckpointError(f"model type {found!r} is not supported (supported: {', '.join(SUPPORTED)})")


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local folder (it exists, or looks like a path) rather than a hub name."""
    return Path(path).expanduser().exists() or path.startswith(("/", ".", "~")) or "\\" in path


def read_config_json(folder: str | Path) -> dict:
    """The ``config.json`` of a local checkpoint folder as a dict (CheckpointError: one line naming the file)."""
    config_file = Path(folder).expanduser() / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"cannot read a transformers config: '{config_file}' not found")
    try:
        description = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read a transformers config from '{config_file}': {first_line(exc)}") from None
    if not isinstance(description, dict):
        raise CheckpointError(f"'{config_file}' does not hold a JSON object")
    return description


def architecture_of(path_or_config: object) -> str:
    """The supported ``model_type`` of a checkpoint folder, hub name, transformers config or config dict.

    Raises :class:`CheckpointError` naming the model type found and the supported ones, or
    naming the path when no config can be read there.
    """
    if isinstance(path_or_config, Mapping):
        found = path_or_config.get("model_type")
    elif hasattr(path_or_config, "model_type") and not isinstance(path_or_config, (str, Path)):
        found = path_or_config.model_type
    else:
        found = _read_model_type(str(path_or_config))
    if found not in ARCHITECTURES:
        raise _unsupported(found)
    return found


def _read_model_type(path: str) -> object:
    if looks_local(path):
        return read_config_json(path).get("model_type")
    from transformers import AutoConfig  # noqa: PLC0415 - transformers is optional (the hf extra); importing it costs seconds

    try:
        return AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read a transformers config from '{path}': {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' multi-line load report and its progress bar, restoring both after."""
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 - transformers is optional (the hf extra); importing it costs seconds

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


# What a failed ``from_pretrained`` raises (a corrupt safetensors file: SafetensorError).
LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, TypeError, IndexError, SafetensorError)


def _some(keys: Iterable[str], limit: int = 5) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _strip_base(key: str, family: Architecture) -> str:
    prefix = family.base_attr + "."
    return key[len(prefix):] if key.startswith(prefix) else key


def load_pretrained_classifier(path: str | Path, num_labels: int, *, log: Callable[[str], None] | None = None):
    """Load a supported encoder checkpoint as its family's ``ForSequenceClassification`` (SDPA).

    Every encoder weight must come from the checkpoint with the configured shape; only the
    classification head may be missing or of another size (it is then newly initialised and
    ``log`` is called exactly once with a one-line message; default ``warnings.warn``).
    Anything else raises :class:`CheckpointError` naming the first offending keys.
    """
    kind = architecture_of(path)
    family = ARCHITECTURES[kind]
    cls = family.classifier()
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(
                str(path), num_labels=num_labels, attn_implementation="sdpa",
                ignore_mismatched_sizes=True, output_loading_info=True,
                # transformers 5 defaults to dtype="auto": a half-precision checkpoint would then be
                # trained and timed in half precision on the CPU, and reload as float32 later.
                dtype=torch.float32,
            )
    except LOAD_ERRORS as exc:
        raise CheckpointError(f"cannot load a {kind} checkpoint from '{path}': {first_line(exc)}") from exc
    config = model.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise CheckpointError(f"'{path}' is configured as a decoder (is_decoder/add_cross_attention); only encoders are supported")

    def is_head(key: str) -> bool:
        return key.startswith(family.head_prefixes)

    missing = set(info.get("missing_keys", ()))
    unexpected = set(info.get("unexpected_keys", ()))
    mismatched = {entry[0]: entry for entry in info.get("mismatched_keys", ())}
    problems = []
    if bad := sorted(k for k in missing if not is_head(k)):
        problems.append(f"encoder weights missing from the checkpoint: {_some(bad)}")
    if bad := sorted(k for k in mismatched if not is_head(k)):
        shapes = [f"{k} (checkpoint {list(mismatched[k][1])}, config {list(mismatched[k][2])})" for k in bad]
        problems.append(f"encoder weights of another shape: {_some(shapes, 3)}")
    # another task's head (e.g. a token-classification ``classifier.weight``) is replaced like a missing one
    ignorable = family.ignorable_prefixes + ("classifier.",)
    ignored = sorted(k for k in unexpected if _strip_base(k, family).startswith(ignorable))
    if bad := sorted(unexpected.difference(ignored)):
        problems.append(f"checkpoint weights that {cls.__name__} has no place for: {_some(bad)}")
    if errors := [m for m in info.get("error_msgs", ()) if m]:
        problems.append(f"load errors: {first_line(Exception(errors[0]))}")
    if problems:
        raise CheckpointError(f"'{path}' does not fit {cls.__name__} ({kind}): " + "; ".join(problems))

    new_head = sorted({k.rsplit(".", 1)[0] for k in missing.union(mismatched) if is_head(k)})
    notes = []
    if new_head:
        reason = "another label count in the checkpoint" if mismatched else "not in the checkpoint"
        notes.append(f"new classification head ({', '.join(new_head)}) for {num_labels} labels ({reason}); train it before use")
    if ignored:
        notes.append(f"{len(ignored)} checkpoint weights not used by the classifier were ignored ({_some(ignored, 3)})")
    if notes:
        message = f"{cls.__name__} from '{path}': " + "; ".join(notes)
        if log is None:
            warnings.warn(message, stacklevel=2)
        else:
            log(message)
    return model.eval()


def _architecture_of(hf_model: nn.Module) -> Architecture:
    return ARCHITECTURES[architecture_of(hf_model.config)]


def model_type(hf_model: nn.Module) -> str:
    """The supported ``model_type`` of a transformers model (CheckpointError if unsupported)."""
    return _architecture_of(hf_model).model_type


def base_model(hf_model: nn.Module) -> nn.Module:
    """The encoder model inside a classifier (``.bert``, ``.roberta``, ``.electra``); a base model is returned as is."""
    family = _architecture_of(hf_model)
    inner = getattr(hf_model, family.base_attr, None)
    if inner is not None:
        return inner
    if hasattr(hf_model, "encoder") and hasattr(hf_model, "embeddings"):
        return hf_model
    raise CheckpointError(f"{type(hf_model).__name__} has no '{family.base_attr}' encoder")


def encoder_layers(hf_model: nn.Module) -> list[nn.Module]:
    """The encoder's transformer layers, in order."""
    return list(base_model(hf_model).encoder.layer)


def self_attention(layer: nn.Module) -> nn.Module:
    """The self-attention module of one encoder layer (``layer.attention.self``)."""
    return layer.attention.self


def set_self_attention(layer: nn.Module, module: nn.Module) -> None:
    """Install ``module`` as the self-attention of one encoder layer, in the layer's train/eval mode.

    A freshly built module is in training mode; installed as is into an eval-mode model it
    would apply attention dropout at inference, so its mode is set to the layer's.
    """
    module.train(layer.training)
    layer.attention.self = module


def attention_output_dense(layer: nn.Module) -> nn.Linear:
    """The projection after self-attention (``layer.attention.output.dense``); its input columns follow the heads."""
    return layer.attention.output.dense


def intermediate(layer: nn.Module) -> nn.Module:
    """The first feed-forward module of one encoder layer (``layer.intermediate``: dense + activation)."""
    return layer.intermediate


def set_intermediate(layer: nn.Module, module: nn.Module) -> None:
    """Install ``module`` as the layer's ``intermediate`` (in the layer's train/eval mode)."""
    module.train(layer.training)
    layer.intermediate = module


def ffn_output_dense(layer: nn.Module) -> nn.Linear:
    """The second feed-forward projection (``layer.output.dense``); its input columns follow the FFN neurons."""
    return layer.output.dense


def classifier_from_config(config_dict: dict):
    """A randomly initialised ``ForSequenceClassification`` of the family named in ``config_dict`` (SDPA, eval mode).

    ``config_dict`` is a saved ``config.to_dict()``; load the weights with ``load_state_dict`` afterwards.
    """
    family = ARCHITECTURES[architecture_of(config_dict)]
    cls = family.classifier()
    try:
        config = cls.config_class.from_dict(dict(config_dict))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"invalid {family.model_type} config: {first_line(exc)}") from exc
    config._attn_implementation = "sdpa"
    return cls(config).eval()


def _heads_of(attention: nn.Module) -> int:
    for name in ("num_heads", "num_attention_heads"):
        if hasattr(attention, name):
            return int(getattr(attention, name))
    raise TypeError(f"{type(attention).__name__} does not say how many heads it has")


def unmodified_reference(hf_model: nn.Module):
    """A fresh model of the same class and config holding the same weights, in eval mode.

    This is the "unmodified transformers model" that gated or pruned models are timed and
    compared against. Only valid while no head has been pruned (ValueError otherwise).
    """
    config = hf_model.config
    for index, layer in enumerate(encoder_layers(hf_model)):
        heads = _heads_of(self_attention(layer))
        if heads != config.num_attention_heads:
            raise ValueError(
                f"layer {index} has {heads} of {config.num_attention_heads} heads: "
                "a pruned model has no unmodified reference"
            )
    reference = type(hf_model)(copy.deepcopy(config))
    reference.load_state_dict(hf_model.state_dict())
    parameter = next(hf_model.parameters(), None)
    if parameter is not None:
        reference.to(device=parameter.device, dtype=parameter.dtype)
    return reference.eval()

