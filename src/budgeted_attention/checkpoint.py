"""Saving and loading models: safetensors weights plus a JSON description, no pickle.

A checkpoint named ``NAME`` is two files:

* ``NAME.safetensors``: the tensors;
* ``NAME.json``: format tag, model config (with the heads kept per layer for pruned models),
  optional head ranking / kept head indices, tensor shapes and the SHA-256 of the weights file.

Loading checks the format tag, the hash (catches truncated or corrupted weights and a weights
file that belongs to another checkpoint), the tensor names and shapes, and raises
:class:`CheckpointError` with the offending path and reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.io import atomic_path, sha256_file, write_json_atomic
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier

FORMAT = "budgeted_attention.encoder/1"


def checkpoint_paths(path: str | Path) -> tuple[Path, Path]:
    """(weights, description) paths for ``NAME``, ``NAME.json`` or ``NAME.safetensors``."""
    base = Path(path)
    if base.suffix in (".json", ".safetensors"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".safetensors"), base.with_name(base.name + ".json")


def save_model(model: EncoderClassifier, path: str | Path, **extra: Any) -> Path:
    """Save ``model`` atomically as ``NAME.safetensors`` + ``NAME.json``; returns the JSON path.

    ``extra`` entries (JSON-serialisable: ranking, kept heads, method, budget...) go into the JSON.
    """
    weights_path, meta_path = checkpoint_paths(path)
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    with atomic_path(weights_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
    description = {
        "format": FORMAT,
        "model_config": json.loads(model.config.to_json()),
        "weights_file": weights_path.name,
        "weights_sha256": sha256_file(weights_path),
        "tensors": {name: list(tensor.shape) for name, tensor in tensors.items()},
        **extra,
    }
    write_json_atomic(meta_path, description)
    return meta_path


def read_description(path: str | Path) -> dict[str, Any]:
    """The JSON description of a checkpoint, validated for format."""
    _, meta_path = checkpoint_paths(path)
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint description not found: '{meta_path}'")
    try:
        description = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint description '{meta_path}' is not valid JSON: {exc}") from exc
    if not isinstance(description, dict) or description.get("format") != FORMAT:
        found = description.get("format") if isinstance(description, dict) else None
        raise CheckpointError(f"'{meta_path}' is not a {FORMAT} checkpoint (format: {found!r})")
    return description


def load_model(path: str | Path) -> tuple[EncoderClassifier, dict[str, Any]]:
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
    try:
        config = ModelConfig.from_json_dict(description["model_config"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"bad model_config in '{meta_path}': {exc}") from exc
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read '{weights_path}': {exc}") from exc
    model = EncoderClassifier(config)
    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    found = {name: list(t.shape) for name, t in tensors.items()}
    if expected != found:
        missing = sorted(set(expected) - set(found))
        unexpected = sorted(set(found) - set(expected))
        wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
        raise CheckpointError(
            f"'{weights_path}' does not fit its config: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, wrong shapes {wrong[:3]}"
        )
    model.load_state_dict(tensors)
    model.eval()
    return model, description


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Raw tensors of a checkpoint (hash-checked), e.g. for inspection."""
    weights_path, _ = checkpoint_paths(path)
    description = read_description(path)
    if sha256_file(weights_path) != description.get("weights_sha256"):
        raise CheckpointError(f"'{weights_path}' does not match its description (SHA-256 differs)")
    return load_file(str(weights_path))
