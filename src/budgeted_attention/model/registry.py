"""The one registry of model families: name -> model class, pipeline builder and capabilities.

Everything that must know which families exist or what one can do (checkpoint loading, the
experiment pipeline's config checks and builders, ``baa serve``, bench, export) asks here, never
a list of names of its own. A new family is one entry below plus its own module(s).

Classes are named as ``"module:attribute"`` and imported on first use: the BERT family needs
``transformers``, an optional dependency, and importing it costs seconds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any

from budgeted_attention.errors import ConfigError


@dataclass(frozen=True)
class Capabilities:
    """What a family supports; each flag gates a feature in one place.

    Attributes:
        classify: the model maps texts to class logits (``baa serve``, accuracy metrics);
            False for causal language models.
        lm: the model is a causal language model (``task: lm``).
        routing: a per-input head router can be attached (BudgetFormer, capped routing).
        lean: a lean inference executor exists (``GatedModel.inference_module``).
        onnx: ``baa export`` writes ONNX graphs of it.
        ffn_units: feed-forward neuron groups can be put under the budget (``budget_scope: all``).
        depth: the model shape is the config's (the ``ladder`` method trains smaller shapes).
        pretrained: the first model is loaded from a pretrained checkpoint (``pretrained.path``).
    """

    classify: bool
    lm: bool
    routing: bool
    lean: bool
    onnx: bool
    ffn_units: bool
    depth: bool
    pretrained: bool


CAPABILITY_NAMES = tuple(f.name for f in fields(Capabilities))


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
        name: the ``model_family`` config value and the ``family`` field of checkpoints.
        model_class: ``"module:Class"`` of its :class:`~budgeted_attention.model.family.GatedModel`.
        builder: ``"module:Class"`` of the pipeline builder that makes its first model (named,
            not imported: the registry sits below the pipeline).
        capabilities: what it supports.
        extra: the pip extra its optional dependencies come from ("" when none).
    """

    name: str
    model_class: str
    builder: str
    capabilities: Capabilities
    extra: str = ""

    def load_class(self) -> type:
        """The model class (imports its module; a missing optional dependency is one clear line)."""
        return _load(self.model_class, self)

    def load_builder(self) -> type:
        """The pipeline builder class of this family."""
        return _load(self.builder, self)

    def supports(self, capability: str) -> bool:
        if capability not in CAPABILITY_NAMES:
            raise ValueError(f"unknown capability {capability!r} (known: {', '.join(CAPABILITY_NAMES)})")
        return bool(getattr(self.capabilities, capability))


def _load(target: str, family: Family) -> Any:
    module_name, attribute = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (pip install '.[{family.extra}]')" if family.extra else ""
        raise ConfigError(f"model family {family.name!r} needs an optional dependency{hint}: {exc}") from exc
    return getattr(module, attribute)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            "encoder", "budgeted_attention.model.transformer:EncoderClassifier", "budgeted_attention.pipeline.builders:EncoderBuilder",
            Capabilities(classify=True, lm=False, routing=True, lean=True, onnx=True, ffn_units=True, depth=True, pretrained=False),
        ),
        Family(
            "bert", "budgeted_attention.hf.bert:GatedBertClassifier", "budgeted_attention.pipeline.builders:PretrainedBuilder",
            Capabilities(classify=True, lm=False, routing=True, lean=True, onnx=True, ffn_units=True, depth=False, pretrained=True),
            extra="hf",
        ),
        Family(
            "decoder", "budgeted_attention.model.decoder:CausalLM", "budgeted_attention.pipeline.builders:DecoderBuilder",
            Capabilities(classify=False, lm=True, routing=False, lean=True, onnx=False, ffn_units=True, depth=True, pretrained=False),
        ),
        Family(
            "hf-decoder", "budgeted_attention.hf.decoder:GatedDecoderLM", "budgeted_attention.pipeline.builders:HFDecoderBuilder",
            Capabilities(classify=False, lm=True, routing=False, lean=True, onnx=False, ffn_units=True, depth=False, pretrained=True),
            extra="hf",
        ),
        Family(
            "hf-decoder-classifier", "budgeted_attention.hf.decoder_classifier:GatedDecoderClassifier",
            "budgeted_attention.pipeline.builders:HFDecoderClassifierBuilder",
            Capabilities(classify=True, lm=False, routing=False, lean=True, onnx=False, ffn_units=True, depth=False, pretrained=True),
            extra="hf",
        ),
    )
}


def get_family(name: str, what: str = "model_family") -> Family:
    """The family called ``name``; an unknown name is a :class:`ConfigError` naming it and the known ones."""
    if name not in FAMILIES:
        raise ConfigError(f"{what} must be one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def families_with(capability: str) -> tuple[str, ...]:
    """Names of the families that have ``capability`` (see :class:`Capabilities`)."""
    return tuple(name for name, family in FAMILIES.items() if family.supports(capability))


def require(name: str, capability: str, feature: str) -> Family:
    """The family ``name``, refusing with one line when it lacks ``capability``.

    ``feature`` says what needed it, e.g. ``"baa serve (text classification)"``.
    """
    family = get_family(name)
    if not family.supports(capability):
        able = families_with(capability)
        raise ConfigError(f"{feature} needs a model family with {capability} ({', '.join(able) or 'none'}); this is a {name!r} model")
    return family
