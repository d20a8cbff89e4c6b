"""What the server runs: a run directory's budgeted-hard model, its tokenizer and labels, behind
one ``classify(texts, budget)`` call for either backend.

* ``torch``: one copy of the weights sorted by the checkpoint's ranking
  (:class:`~budgeted_attention.pruning.switching.SlicedModel`); a budget switch only changes the
  per-layer head and FFN-group counts, so every budget shares the same weights.
* ``onnxruntime``: one graph per budget written by ``baa export`` (constant per-layer counts).

The engine is not thread-safe: the batcher calls it from one worker thread.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from budgeted_attention.checkpoint import load_model, load_ranking, parse_ranking, read_description, verify_artifacts
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.model.registry import families_with, get_family
from budgeted_attention.pruning.switching import SlicedModel
from budgeted_attention.rundir import RunDir
from budgeted_attention.serving.config import ServeConfig


@dataclass
class Prediction:
    """Output of one model call.

    Attributes:
        probabilities: (n_texts, n_classes) class probabilities.
        budget: the budget the call ran at.
        seconds: wall time of tokenisation + forward pass.
        n_tokens: padded sequence length of the batch.
    """

    probabilities: torch.Tensor
    budget: float
    seconds: float
    n_tokens: int


def check_classifier(checkpoint: Path, family: str) -> None:
    """CheckpointError unless ``family`` (a checkpoint's model family) classifies texts."""
    if not get_family(family).supports("classify"):
        raise CheckpointError(f"'{checkpoint}' is a {family!r} model; baa serve classifies texts ({', '.join(families_with('classify'))} runs)")


def check_graphs(onnx_dir: Path, budgets: list[float], run_dir: str | Path, *, int8: bool = False) -> None:
    """ConfigError unless ``onnx_dir`` holds the ONNX graph (``int8``: the int8 graph) of every
    budget (``baa export [--int8]`` writes them)."""
    from budgeted_attention.export.onnx import graph_path  # noqa: PLC0415 - onnx is optional

    missing = [b for b in budgets if not graph_path(onnx_dir, b, int8=int8).is_file()]
    if missing:
        listed = ",".join(f"{b:g}" for b in budgets)
        kind = "int8 ONNX graph" if int8 else "ONNX graph"
        raise ConfigError(f"no {kind} for budgets {missing} in '{onnx_dir}' (run 'baa export {run_dir} --budget {listed}{' --int8' if int8 else ''}' first)")


def run_labels(run_dir: Path, n_classes: int) -> list[str]:
    """Class names of a run: its labels file (written by the pipeline), else the data source's
    names from the run's config, else ``class_0...``."""
    path = RunDir(run_dir).labels
    if path.is_file():
        try:
            names = json.loads(path.read_text(encoding="utf-8"))["class_names"]
            if isinstance(names, list) and len(names) == n_classes:
                return [str(n) for n in names]
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            pass
    try:
        from budgeted_attention.config import from_dict, load_yaml  # noqa: PLC0415 - the class names of a run without labels.json only
        from budgeted_attention.data.sources import load_source  # noqa: PLC0415 - as above
        from budgeted_attention.data.text import TextDataConfig  # noqa: PLC0415 - as above

        data = load_yaml(RunDir(run_dir).config).get("data", {})
        names = list(load_source(from_dict(TextDataConfig, data, "data")).class_names)
        if len(names) == n_classes:
            return names
    except Exception:  # noqa: BLE001 - labels are cosmetic; the synthetic task has no source names
        pass
    return [f"class_{i}" for i in range(n_classes)]


def validation_accuracy(run_dir: Path, seed: int) -> dict[float, float]:
    """Validation accuracy of the run's budgeted-hard model per budget (the run's results; never test)."""
    path = RunDir(run_dir).results_json
    if not path.is_file():
        return {}
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}
    return {
        float(r["budget"]): float(r["val_accuracy"])
        for r in rows
        if r.get("method") == "budgeted-hard" and r.get("seed") == seed and r.get("val_accuracy") is not None
    }


def floor_budget(cfg: ServeConfig, val_accuracy: dict[float, float]) -> float:
    """The SLO policy's floor: the smallest configured budget at or above ``min_budget``, raised to
    the smallest budget whose validation accuracy meets ``min_accuracy`` when that is set.

    Raises:
        ConfigError: no configured budget meets ``min_accuracy``.
    """
    floor = min(b for b in cfg.budgets if b >= cfg.min_budget - 1e-9)  # the config checks one exists
    if cfg.min_accuracy > 0:
        meeting = [b for b in cfg.budgets if val_accuracy.get(b, -1.0) >= cfg.min_accuracy]
        if not meeting:
            raise ConfigError(
                f"serve.min_accuracy ({cfg.min_accuracy}) is met by no budget in {cfg.budgets} "
                f"(validation accuracy: {val_accuracy or f'not in {RunDir.results_json.name}'})"
            )
        floor = max(floor, min(meeting))
    return floor


def load_tokenizer(folder: Path, max_len: int) -> tuple[Tokenizer, int]:
    """The tokenizer of the run directory ``folder``, unpadded and truncating to ``max_len``, and its pad id."""
    path = RunDir(folder).tokenizer
    if not path.is_file():
        raise CheckpointError(f"no {RunDir.tokenizer.name} in '{folder}' (baa serve needs the run's tokenizer)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise CheckpointError(f"cannot read tokenizer '{path}': {exc}") from exc
    if tokenizer.padding is None:
        raise CheckpointError(f"tokenizer '{path}' does not pad (not written by baa)")
    pad_id = int(tokenizer.padding["pad_id"])
    tokenizer.no_padding()  # the batcher pads whole batches (requests are tokenised one by one)
    tokenizer.enable_truncation(max_length=max_len)
    return tokenizer, pad_id


class EngineInfo:
    """What the server needs of an engine besides the model call: the tokenizer, labels, budgets'
    costs and validation accuracy, the floor and ``/v1/info``. Shared by :class:`Engine` (the model
    in this process) and :class:`~budgeted_attention.serving.remote.RemoteEngine` (in a child),
    which set the attributes below.
    """

    run_dir: Path
    cfg: ServeConfig
    checkpoint: Path
    seed: int
    family: str
    max_len: int
    n_classes: int
    labels: list[str]
    val_accuracy: dict[float, float]
    costs: dict[float, float]
    runtime: str  # what runs the model: the module tree, a lean copy, or ONNX Runtime
    tokenizer: Tokenizer
    pad_id: int
    first_ordinary_id: int  # the low end of synthetic warm-up ids (the model family's)
    in_child = False  # the model runs in a child process (RemoteEngine)

    def folder(self) -> Path:
        """The run directory, or the checkpoint's folder when given a checkpoint file."""
        return self.run_dir if self.run_dir.is_dir() else self.checkpoint.parent

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, truncated to the model's ``max_len``, unpadded."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def run(self, ids: list[list[int]], budget: float) -> torch.Tensor:  # pragma: no cover - abstract
        """(batch, n_classes) class probabilities of token ids at ``budget`` (a configured budget)."""
        raise NotImplementedError

    def classify(self, texts: list[str], budget: float) -> Prediction:
        """Class probabilities of ``texts`` at ``budget``, timed (tokenisation included)."""
        start = time.perf_counter()
        ids = self.tokenize(texts)
        probabilities = self.run(ids, budget)
        return Prediction(probabilities, budget, time.perf_counter() - start, max(len(x) for x in ids))

    def min_allowed_budget(self) -> float:
        """The SLO policy's floor (:func:`floor_budget`)."""
        return floor_budget(self.cfg, self.val_accuracy)

    def metadata(self) -> dict[str, Any]:
        """The loaded model's facts, as plain values (what a child process sends its parent)."""
        return {
            "checkpoint": str(self.checkpoint), "seed": self.seed, "family": self.family, "max_len": self.max_len,
            "n_classes": self.n_classes, "labels": self.labels, "val_accuracy": self.val_accuracy, "costs": self.costs,
            "runtime": self.runtime, "first_ordinary_id": self.first_ordinary_id,
        }

    def describe(self, expose_paths: bool = False) -> dict[str, Any]:
        """What /v1/info reports; where the model came from as names relative to the run directory
        unless ``expose_paths`` (then absolute paths, and the process ids)."""
        checkpoint = self.checkpoint
        if not expose_paths:
            try:
                checkpoint = checkpoint.relative_to(self.folder())
            except ValueError:
                checkpoint = Path(checkpoint.name)
        info = {
            "run_dir": str(self.run_dir) if expose_paths else self.run_dir.name,
            "checkpoint": str(checkpoint),
            "family": self.family,
            "seed": self.seed,
            "backend": self.cfg.backend,
            "runtime": self.runtime,
            "engine_process": self.in_child,
            "engine_cpus": self.cfg.engine_cpus,
            "budgets": self.cfg.budgets,
            "estimated_cost": {str(b): round(c, 4) for b, c in self.costs.items()},
            "validation_accuracy": {str(b): round(a, 4) for b, a in sorted(self.val_accuracy.items())},
            "labels": self.labels,
            "max_len": self.max_len,
        }
        if expose_paths:
            info.update(pid=os.getpid(), engine_pid=getattr(self, "pid", None))
        return info


class Engine(EngineInfo):
    """A run's budgeted-hard model, ready to classify texts at any configured budget."""

    def __init__(self, run_dir: str | Path, cfg: ServeConfig, *, seed: int | None = None, onnx_dir: str | Path | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        _, checkpoint = RunDir.locate(self.run_dir, seed, command="baa experiment")
        description = read_description(checkpoint)
        parse_ranking(checkpoint, description)
        self.checkpoint = checkpoint
        self.seed = int(description.get("seed", seed or 0))
        model, description = load_model(checkpoint)
        check_classifier(checkpoint, model.family)
        self.ranking = load_ranking(checkpoint, description, model)
        self.family = model.family
        self.first_ordinary_id = model.first_ordinary_id()
        self.max_len = int(model.max_len)
        verify_artifacts(checkpoint, description, self.folder(), model)  # another run's tokenizer would be served silently
        self.tokenizer, self.pad_id = load_tokenizer(self.folder(), self.max_len)
        self.n_classes = int(self._n_classes(model))
        self.labels = run_labels(self.folder(), self.n_classes)
        self.val_accuracy = validation_accuracy(self.run_dir, self.seed) if self.run_dir.is_dir() else {}
        self.costs = {b: float(self.ranking.kept_cost(b)) for b in cfg.budgets}  # the budgeted FLOPs kept
        torch.set_num_threads(cfg.threads)
        self.sliced: SlicedModel | None = None
        self.sessions: dict[float, Any] = {}
        if cfg.backend == "torch":
            self.sliced = SlicedModel(model, self.ranking).eval()
            lean = self.sliced.lean
            self.runtime = "module tree" if lean is None else f"lean copy ({type(lean).__name__})"
        else:
            self._load_onnx(Path(onnx_dir) if onnx_dir else RunDir(self.folder()).onnx_dir)
            self.runtime = "onnxruntime int8" if cfg.int8 else "onnxruntime"

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _n_classes(model: torch.nn.Module) -> int:
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "n_classes"):
            return config.n_classes
        return model.hf.config.num_labels  # the BERT family

    def _load_onnx(self, onnx_dir: Path) -> None:
        from budgeted_attention.export.onnx import graph_path, make_session  # noqa: PLC0415 - the onnxruntime backend only

        check_graphs(onnx_dir, self.cfg.budgets, self.run_dir, int8=self.cfg.int8)
        self.sessions = {b: make_session(graph_path(onnx_dir, b, int8=self.cfg.int8), self.cfg.threads) for b in self.cfg.budgets}

    # ------------------------------------------------------------------ inference

    def pad(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, seq) token ids and attention mask, right-padded to the longest text."""
        length = max(len(x) for x in ids)
        batch = torch.full((len(ids), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), length), dtype=torch.long)
        for row, tokens in enumerate(ids):
            batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1
        return batch, mask

    def run(self, ids: list[list[int]], budget: float) -> torch.Tensor:
        """(batch, n_classes) class probabilities of token ids at ``budget`` (a configured budget)."""
        input_ids, mask = self.pad(ids)
        if self.sliced is not None:
            with torch.inference_mode():
                if self.sliced.budget != budget:
                    self.sliced.set_budget(budget)
                logits = self.sliced(input_ids, mask)
        else:
            feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
            logits = torch.from_numpy(self.sessions[budget].run(None, feed)[0])
        return torch.softmax(logits.float(), dim=-1)
