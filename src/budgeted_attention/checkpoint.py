"""Saving and loading models of every family: safetensors weights plus a JSON description, no pickle.

A checkpoint named ``NAME`` is two files:

* ``NAME.safetensors``: the tensors;
* ``NAME.json``: format tag, model family, the family's architecture description (including the
  original head ids of pruned or sorted models), tensor shapes, the SHA-256 of the weights file,
  and extra entries (method, seed, head ranking, training steps...).

Loading checks the format tag, the family, the hash (catches truncated or corrupted weights and a
weights file that belongs to another checkpoint), the tensor names and shapes, and raises
:class:`CheckpointError` with the offending path and reason.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from budgeted_attention.errors import BAAError, CheckpointError
from budgeted_attention.io import atomic_path, sha256_file, write_json_atomic
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.router import RouterConfig

FORMAT = "budgeted_attention/2"

# family name -> "module:class"; imported lazily so optional dependencies stay optional.
FAMILIES = {
    "encoder": "budgeted_attention.model.transformer:EncoderClassifier",
    "bert": "budgeted_attention.hf.bert:GatedBertClassifier",
    "decoder": "budgeted_attention.model.decoder:CausalLM",
}


def family_class(name: str) -> type[GatedModel]:
    """The model class of family ``name``."""
    if name not in FAMILIES:
        raise CheckpointError(f"unknown model family {name!r} (known: {', '.join(sorted(FAMILIES))})")
    module_name, class_name = FAMILIES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CheckpointError(f"model family {name!r} needs an optional dependency: {exc}") from exc
    return getattr(module, class_name)


def checkpoint_paths(path: str | Path) -> tuple[Path, Path]:
    """(weights, description) paths for ``NAME``, ``NAME.json`` or ``NAME.safetensors``."""
    base = Path(path)
    if base.suffix in (".json", ".safetensors"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".safetensors"), base.with_name(base.name + ".json")


def save_model(model: GatedModel, path: str | Path, **extra: Any) -> Path:
    """Save ``model`` atomically as ``NAME.safetensors`` + ``NAME.json``; returns the JSON path.

    ``extra`` entries (JSON-serialisable: ranking, method, budget, steps...) go into the JSON.
    """
    if not getattr(model, "family", ""):
        raise TypeError(f"{type(model).__name__} does not implement the model family interface")
    weights_path, meta_path = checkpoint_paths(path)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    with atomic_path(weights_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "family": model.family})
        digest = sha256_file(tmp)  # of the bytes that are renamed into place (a non-zero rank renames nothing)
    description = {
        "format": FORMAT,
        "family": model.family,
        "architecture": model.describe(),
        **({"router": model.router.describe()} if getattr(model, "router", None) is not None else {}),
        "weights_file": weights_path.name,
        "weights_sha256": digest,
        "tensors": {name: list(tensor.shape) for name, tensor in tensors.items()},
        **extra,
    }
    write_json_atomic(meta_path, description)
    return meta_path


def read_description(path: str | Path) -> dict[str, Any]:
    """The JSON description of a checkpoint, validated for format and family."""
    _, meta_path = checkpoint_paths(path)
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint description not found: '{meta_path}'")
    try:
        description = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(f"checkpoint description '{meta_path}' is not valid JSON: {exc}") from exc
    if not isinstance(description, dict) or description.get("format") != FORMAT:
        found = description.get("format") if isinstance(description, dict) else None
        raise CheckpointError(f"'{meta_path}' is not a {FORMAT} checkpoint (format: {found!r})")
    if not isinstance(description.get("architecture"), dict):
        raise CheckpointError(f"'{meta_path}' has no architecture description")
    family_class(str(description.get("family")))
    return description


def load_model(path: str | Path) -> tuple[GatedModel, dict[str, Any]]:
    """Load a checkpoint saved by :func:`save_model`; returns (model in eval mode, description)."""
    weights_path, meta_path = checkpoint_paths(path)
    description = read_description(path)
    if not weights_path.is_file():
        raise CheckpointError(f"checkpoint weights not found: '{weights_path}'")
    if sha256_file(weights_path) != description.get("weights_sha256"):
        raise CheckpointError(
            f"'{weights_path}' does not match '{meta_path}' (SHA-256 differs: truncated, corrupted "
            "or from another checkpoint)"
        )
    cls = family_class(description["family"])
    try:
        model = cls.from_description(description["architecture"])
        if "router" in description:  # a per-input head router (BudgetFormer / capped)
            router = model.attach_router(RouterConfig.from_dict(description["router"]["config"]))
            router.load_calibration(description["router"].get("calibration", {}), description["router"].get("spread_scale", {}))
    except (BAAError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"bad architecture in '{meta_path}': {str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read '{weights_path}': {exc}") from exc
    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    found = {name: list(t.shape) for name, t in tensors.items()}
    if expected != found:
        missing = sorted(set(expected) - set(found))
        unexpected = sorted(set(found) - set(expected))
        wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
        raise CheckpointError(
            f"'{weights_path}' does not fit its description: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, wrong shapes {wrong[:3]}"
        )
    model.load_state_dict(tensors)
    model.eval()
    return model, description


def parse_ranking(path: str | Path, description: dict[str, Any]):
    """The ranking (heads, or heads and FFN groups) stored in a checkpoint description.

    Raises:
        CheckpointError: no ranking (not a budgeted-hard checkpoint) or a malformed one.
    """
    from budgeted_attention.pruning.selection import ranking_from_dict  # noqa: PLC0415

    _, meta_path = checkpoint_paths(path)
    if "ranking" not in description:
        raise CheckpointError(f"'{meta_path}' has no head ranking (not a budgeted-hard checkpoint)")
    try:
        if not isinstance(description["ranking"], dict):
            raise TypeError(f"expected a mapping, got {type(description['ranking']).__name__}")
        ranking = ranking_from_dict(description["ranking"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"malformed head ranking in '{meta_path}': {exc}") from exc
    return ranking


def load_ranking(path: str | Path, description: dict[str, Any], model: GatedModel):
    """The ranking stored with a checkpoint (:func:`parse_ranking`), checked against the model's grid."""
    from budgeted_attention.pruning.selection import UnitRanking  # noqa: PLC0415

    _, meta_path = checkpoint_paths(path)
    ranking = parse_ranking(path, description)
    if (ranking.n_layers, ranking.n_heads) != (model.n_layers, model.n_heads):
        raise CheckpointError(
            f"head ranking in '{meta_path}' is for {ranking.n_layers}x{ranking.n_heads} heads, "
            f"the model has {model.n_layers}x{model.n_heads}"
        )
    groups = ranking.n_groups if isinstance(ranking, UnitRanking) else 0
    if groups != model.n_groups:
        raise CheckpointError(
            f"ranking in '{meta_path}' is for {groups} FFN groups per layer, the model has {model.n_groups}"
        )
    return ranking


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Raw tensors of a checkpoint (hash-checked), e.g. for inspection."""
    weights_path, _ = checkpoint_paths(path)
    description = read_description(path)
    if sha256_file(weights_path) != description.get("weights_sha256"):
        raise CheckpointError(f"'{weights_path}' does not match its description (SHA-256 differs)")
    return load_file(str(weights_path))
