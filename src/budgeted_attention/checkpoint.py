"""Saving and loading models of every family: safetensors weights plus a JSON description, no pickle.

A checkpoint named ``NAME`` is two files:

* ``NAME.safetensors``: the tensors;
* ``NAME.json``: format tag, model family, the family's architecture description (including the
  original head ids of pruned or sorted models), tensor shapes, the SHA-256 of the weights file,
  and extra entries (method, seed, head ranking, training steps...).

Loading checks the format tag, the family, the hash (catches truncated or corrupted weights and a
weights file that belongs to another checkpoint), the tensor names and shapes, and raises
:class:`CheckpointError` with the offending path and reason.

Provenance of the files a model needs beside its weights: a checkpoint saved with
``artifacts_dir`` (the run directory) records ``tokenizer`` (``file``, ``sha256``, ``vocab_size``)
and ``labels`` (``file``, ``sha256``, ``n_labels``) of the run that trained it, and
:func:`verify_artifacts` refuses a folder whose files differ. Checkpoints of older code record
neither and load as before, but a tokenizer with more tokens than the model has embedding rows,
or a labels file with another number of classes, is refused for them too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from budgeted_attention.errors import BAAError, CheckpointError, ConfigError
from budgeted_attention.io import atomic_path, sha256_file, write_json_atomic
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.registry import FAMILIES
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.rundir import RunDir

FORMAT = "budgeted_attention/2"


def family_class(name: str) -> type[GatedModel]:
    """The model class of family ``name`` (see :mod:`budgeted_attention.model.registry`)."""
    if name not in FAMILIES:
        raise CheckpointError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})")
    try:
        return FAMILIES[name].load_class()
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def checkpoint_paths(path: str | Path) -> tuple[Path, Path]:
    """(weights, description) paths for ``NAME``, ``NAME.json`` or ``NAME.safetensors``."""
    base = Path(path)
    if base.suffix in (".json", ".safetensors"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".safetensors"), base.with_name(base.name + ".json")


def save_model(model: GatedModel, path: str | Path, *, artifacts_dir: str | Path | None = None, **extra: Any) -> Path:
    """Save ``model`` atomically as ``NAME.safetensors`` + ``NAME.json``; returns the JSON path.

    ``artifacts_dir``: the run directory whose ``tokenizer.json`` / ``labels.json`` the model was
    trained with; their digests go into the JSON (:func:`artifact_provenance`).
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
        **(artifact_provenance(artifacts_dir) if artifacts_dir is not None else {}),
        **extra,
    }
    write_json_atomic(meta_path, description)
    return meta_path


def _tokenizer_size(path: Path) -> int:
    """Tokens of a ``tokenizers`` JSON file (added tokens included: ids the model can receive)."""
    try:
        return Tokenizer.from_file(str(path)).get_vocab_size()
    except Exception as exc:  # the Rust side raises plain Exception subclasses on malformed files
        raise CheckpointError(f"'{path}' is not a readable tokenizer: {' '.join(str(exc).split())[:200]}") from None


def _label_count(path: Path) -> int:
    """Class names in a run's labels file (:attr:`RunDir.labels`)."""
    try:
        names = json.loads(path.read_text(encoding="utf-8"))["class_names"]
        if not isinstance(names, list):
            raise TypeError("class_names is not a list")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"'{path}' is not a labels file with a class_names list: {exc}") from None
    return len(names)


def artifact_provenance(folder: str | Path) -> dict[str, Any]:
    """``{"tokenizer": {"file", "sha256", "vocab_size"}, "labels": {"file", "sha256", "n_labels"}}``
    for the tokenizer and labels files present in the run directory ``folder`` (a missing one is left out)."""
    run = RunDir(folder)
    found: dict[str, Any] = {}
    if run.tokenizer.is_file():
        found["tokenizer"] = {"file": RunDir.tokenizer.name, "sha256": sha256_file(run.tokenizer), "vocab_size": _tokenizer_size(run.tokenizer)}
    if run.labels.is_file():
        found["labels"] = {"file": RunDir.labels.name, "sha256": sha256_file(run.labels), "n_labels": _label_count(run.labels)}
    return found


def _architecture_size(description: dict[str, Any], key: str) -> int | None:
    """``vocab_size`` (embedding rows) or ``n_classes`` (outputs) from the architecture description:
    our families' ``model_config``, the BERT family's ``hf_config`` (outputs: its ``id2label``)."""
    architecture = description.get("architecture")
    architecture = architecture if isinstance(architecture, dict) else {}
    ours, theirs = architecture.get("model_config"), architecture.get("hf_config")
    value = ours.get(key) if isinstance(ours, dict) else None
    if value is None and isinstance(theirs, dict):
        value = len(theirs.get("id2label") or {}) or None if key == "n_classes" else theirs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def verify_artifacts(checkpoint_path: str | Path, description: dict[str, Any], folder: str | Path, model: GatedModel | None = None) -> None:
    """Refuse the tokenizer and labels files of the run directory ``folder`` when they are not the files
    the checkpoint at ``checkpoint_path`` (its ``description``, from :func:`read_description` or
    :func:`load_model`) was trained with.

    Refused, with a one-line :class:`CheckpointError` naming both files: a file whose SHA-256
    differs from the recorded one; a tokenizer with more tokens than the model's embedding rows
    (``model``'s when given, else the description's ``vocab_size``), or a labels file with another
    number of classes than the model, also for checkpoints that record no digest (older code). A
    file absent from ``folder`` is not checked: the command that needs it says so.
    """
    _, meta_path = checkpoint_paths(checkpoint_path)
    tokenizer, labels = RunDir(folder).tokenizer, RunDir(folder).labels
    if tokenizer.is_file():
        recorded = description.get("tokenizer") if isinstance(description.get("tokenizer"), dict) else {}
        actual = sha256_file(tokenizer)
        size = recorded.get("vocab_size") if actual == recorded.get("sha256") else _tokenizer_size(tokenizer)
        if recorded.get("sha256") and actual != recorded["sha256"]:
            raise CheckpointError(
                f"'{tokenizer}' is not the tokenizer '{meta_path}' was trained with (SHA-256 {actual[:16]}..., {size} tokens; "
                f"recorded {str(recorded['sha256'])[:16]}..., {recorded.get('vocab_size', '?')} tokens): use that run's {RunDir.tokenizer.name}"
            )
        rows = model.input_embedding().num_embeddings if model is not None else _architecture_size(description, "vocab_size")
        if rows is not None and isinstance(size, int) and size > rows:
            raise CheckpointError(
                f"'{tokenizer}' has {size} tokens, more than the {rows} embedding rows of '{meta_path}': it is another model's tokenizer"
            )
    if labels.is_file():
        recorded = description.get("labels") if isinstance(description.get("labels"), dict) else {}
        actual = sha256_file(labels)
        count = _label_count(labels)
        if recorded.get("sha256") and actual != recorded["sha256"]:
            raise CheckpointError(
                f"'{labels}' is not the labels file '{meta_path}' was trained with (SHA-256 {actual[:16]}..., "
                f"recorded {str(recorded['sha256'])[:16]}...): use that run's {RunDir.labels.name}"
            )
        classes = _architecture_size(description, "n_classes")
        if classes is not None and _classifies(description) and count != classes:
            raise CheckpointError(f"'{labels}' names {count} classes, '{meta_path}' has {classes} outputs: it is another model's labels file")


def _classifies(description: dict[str, Any]) -> bool:
    """True when the checkpoint's logits are classes (a language model's are its vocabulary)."""
    family = FAMILIES.get(str(description.get("family")))
    return family is None or family.capabilities.classify


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
    _, meta_path = checkpoint_paths(path)
    if "ranking" not in description:
        raise CheckpointError(f"'{meta_path}' has no head ranking (not a budgeted-hard checkpoint)")
    try:
        if not isinstance(description["ranking"], dict):
            raise TypeError(f"expected a mapping, got {type(description['ranking']).__name__}")
        ranking = Ranking.from_dict(description["ranking"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"malformed head ranking in '{meta_path}': {exc}") from exc
    return ranking


def load_ranking(path: str | Path, description: dict[str, Any], model: GatedModel):
    """The ranking stored with a checkpoint (:func:`parse_ranking`), checked against the model's grid."""
    _, meta_path = checkpoint_paths(path)
    ranking = parse_ranking(path, description)
    if (ranking.n_layers, ranking.n_heads) != (model.n_layers, model.n_heads):
        raise CheckpointError(
            f"head ranking in '{meta_path}' is for {ranking.n_layers}x{ranking.n_heads} heads, "
            f"the model has {model.n_layers}x{model.n_heads}"
        )
    if ranking.n_groups != model.n_groups:
        raise CheckpointError(
            f"ranking in '{meta_path}' is for {ranking.n_groups} FFN groups per layer, the model has {model.n_groups}"
        )
    return ranking
