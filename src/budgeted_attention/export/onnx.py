"""ONNX export: one graph per budget, with the budget's per-layer head and FFN-group counts as
constants, dynamic batch and sequence axes, checked against PyTorch with ONNX Runtime.

The graph is traced from the physically pruned model (:func:`prune_to_budget`), so it holds only
the kept heads' weights. A layer whose heads were all removed contributes only its output bias
(the encoder's attention returns the bias; the BERT family's output projection returns its bias
for zero input features), so the exported layer is LayerNorm(x + bias) with no zero-width matmul.

The trace runs with a padded example batch, so the attention-mask path is the one recorded; an
unpadded batch gives the same result through it.

int8 (``int8=True``): each float graph is also quantized with ONNX Runtime's dynamic quantization
(``quantize_dynamic``, the recipe Hugging Face Optimum applies for CPUs: int8 weights of every
``MatMul``/``Gemm``, per tensor unless ``per_channel``; activations quantized to uint8 at run
time from their observed range, so no calibration data is needed). ONNX Runtime recommends
dynamic over static quantization for transformers; its U8S8 kernels use AVX512-VNNI / AMX where
the CPU has them. The int8 graph is ``budget-<b>.int8.onnx`` next to the float one; it cannot
match the float logits to 1e-4, so its check reports the logit difference and the argmax
agreement with the float graph instead of failing on them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from budgeted_attention.budget import validate_budget
from budgeted_attention.data.inputs import random_ids
from budgeted_attention.errors import BAAError
from budgeted_attention.io import atomic_path, write_json_atomic
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.registry import require
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget

OPSET = 17
INPUTS = ("input_ids", "attention_mask")


class ExportError(BAAError):
    """An export failed or its graph does not reproduce the PyTorch model."""


def graph_path(directory: str | Path, budget: float, *, int8: bool = False) -> Path:
    """Where the graph of ``budget`` lives in an export directory: ``budget-0.5.onnx``, or
    ``budget-0.5.int8.onnx`` for its int8 quantization."""
    return Path(directory) / f"budget-{validate_budget(budget):g}{'.int8' if int8 else ''}.onnx"


class _Logits(nn.Module):
    """(input_ids, attention_mask) -> logits, the two-input signature the graph gets."""

    def __init__(self, model: GatedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, attention_mask)


def example_inputs(model: GatedModel, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (batch, seq) and a mask whose last row is half padding."""
    vocab = model.input_embedding().num_embeddings
    ids = random_ids(vocab, batch, seq, seed=seed, low=model.first_ordinary_id())
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[-1, seq // 2 :] = 0
    return ids, mask


# ONNX Runtime graph fusions every session here leaves off. SkipLayerNormFusion turns the
# residual Add + LayerNormalization of an int8 graph into one SkipLayerNormalization node, and that
# kernel is several times slower than the two nodes it replaces where we timed both ways (Intel
# Xeon, onnxruntime 1.32; benchmarks/int8_profile.py, docs/lab/int8_profile.md; AMD EPYC profiles
# with the fusion on show the node as costly). The cost is the same in
# every layer whatever the budget keeps, so it slowed pruned int8 graphs proportionally more than
# dense ones. It fuses nothing in our float graphs. Every graph, dense or pruned, float or int8,
# gets the same sessions, so comparisons stay like for like.
DISABLED_FUSIONS = ("SkipLayerNormFusion",)


def make_session(path: str | Path, threads: int = 1, *, disabled_fusions: tuple[str, ...] = DISABLED_FUSIONS,
                 optimized_path: str | Path | None = None, profile_prefix: str | Path | None = None):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads (one inter-op thread), every
    graph optimization on except ``disabled_fusions`` (ONNX Runtime's graph transformer names;
    default :data:`DISABLED_FUSIONS`; ``()`` for ONNX Runtime's full set). With
    ``optimized_path``, ONNX Runtime also writes the graph it runs there (to see what it fused);
    with ``profile_prefix``, it profiles every node (``session.end_profiling()`` names the file)."""
    import onnxruntime as ort  # noqa: PLC0415 - onnxruntime is optional (the serve extra)

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled_fusions))


def export_model(model: GatedModel, path: str | Path, *, opset: int = OPSET) -> Path:
    """Trace ``model`` (already pruned or sliced to one budget) to ``path`` atomically; a family
    without ONNX export (see the registry) is refused with one line."""
    require(model.family, "onnx", "ONNX export")
    model = model.eval()
    seq = min(16, model.max_len)
    ids, mask = example_inputs(model, 2, seq)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow fixed at trace time
        torch.onnx.export(
            _Logits(model).eval(), (ids, mask), str(tmp), input_names=list(INPUTS), output_names=["logits"],
            dynamic_axes=axes, opset_version=opset, dynamo=False, do_constant_folding=True,
        )
    return path


def check_graph(model: GatedModel, path: str | Path, *, atol: float = 1e-4, shapes: tuple[tuple[int, int], ...] = ((1, 7), (3, 0))) -> float:
    """Max |ONNX Runtime - PyTorch| over batches of other shapes than the trace's (seq 0 = max_len).

    Raises:
        ExportError: the difference exceeds ``atol``.
    """
    session = make_session(path)
    worst = 0.0
    for index, (batch, seq) in enumerate(shapes):
        ids, mask = example_inputs(model, batch, seq or model.max_len, seed=index + 1)
        with torch.inference_mode():
            expected = model(ids, mask).float()
        found = torch.from_numpy(session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])
        worst = max(worst, float((found - expected).abs().max()))
    if worst > atol:
        raise ExportError(f"ONNX Runtime output of '{path}' differs from PyTorch by {worst:.2e} (> {atol:g})")
    return worst


def quantize_graph(float_path: str | Path, int8_path: str | Path, *, per_channel: bool = False) -> Path:
    """Dynamic int8 quantization of the float graph ``float_path`` to ``int8_path`` (atomically:
    a failure leaves nothing there). Weights of ``MatMul``/``Gemm`` become int8 (per output channel
    with ``per_channel``), activations are quantized at run time.

    Raises:
        ExportError: ONNX Runtime cannot quantize the graph (its message, first line).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415 - onnxruntime is optional (the serve extra)

    int8_path = Path(int8_path)
    root = logging.getLogger()
    level = root.level
    with atomic_path(int8_path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root.setLevel(logging.ERROR)  # the quantizer logs its advice to pre-process on the root logger (we quantize the optimised trace as it is)
        try:
            quantize_dynamic(str(float_path), str(tmp), weight_type=QuantType.QInt8, per_channel=per_channel, op_types_to_quantize=["MatMul", "Gemm"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises bare Exceptions, ValueErrors and protobuf errors: one line for all
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ExportError(f"cannot quantize '{float_path}' to int8: {reason}") from None
        finally:
            root.setLevel(level)
    return int8_path


def check_int8_graph(model: GatedModel, float_path: str | Path, int8_path: str | Path, *, batches: int = 4, batch: int = 8) -> dict[str, float]:
    """How the int8 graph differs from the float graph on random inputs of ``model``'s shape:
    ``{"max_abs_difference": logits, "argmax_agreement": fraction of rows with the same class}``.
    Reported, not enforced (the agreement that counts is on real data: ``benchmarks/int8_peers.py``)."""
    float_session, int8_session = make_session(float_path), make_session(int8_path)
    worst, same, rows = 0.0, 0, 0
    for index in range(batches):
        ids, mask = example_inputs(model, batch, min(32, model.max_len), seed=100 + index)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        expected, found = float_session.run(None, feed)[0], int8_session.run(None, feed)[0]
        worst = max(worst, float(abs(found - expected).max()))
        same += int((found.argmax(-1) == expected.argmax(-1)).sum())
        rows += found.shape[0]
    return {"max_abs_difference": worst, "argmax_agreement": same / rows}


def export_budgets(
    model: GatedModel, ranking: Ranking, budgets: list[float], out_dir: str | Path, *, atol: float = 1e-4,
    int8: bool = False, per_channel: bool = False, log=print,
) -> dict[str, Any]:
    """One checked graph per budget in ``out_dir`` (and with ``int8`` its int8 quantization) plus
    ``export.json`` describing them. Nothing is written for a family without ONNX export.

    All or nothing: the graphs are written and checked in a staging folder beside ``out_dir`` and
    moved in only once every budget has passed, so a failure at the last budget (a graph that
    does not reproduce PyTorch, one that cannot be quantized, an interrupt) leaves ``out_dir`` as
    it was, with no graph of this export and no temporary file."""
    require(model.family, "onnx", "ONNX export" + (" (--int8)" if int8 else ""))
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        graphs = [_export_one(model, ranking, budget, staging, out, atol=atol, int8=int8, per_channel=per_channel, log=log) for budget in budgets]
        out.mkdir(exist_ok=True)
        for budget in budgets:
            os.replace(graph_path(staging, budget), graph_path(out, budget))
            if int8:
                os.replace(graph_path(staging, budget, int8=True), graph_path(out, budget, int8=True))
            else:
                graph_path(out, budget, int8=True).unlink(missing_ok=True)  # an int8 graph of an earlier export would be served beside the new float graph
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    summary = {"format": "onnx", "opset": OPSET, "inputs": list(INPUTS), "family": model.family, "int8": int8, "graphs": graphs}
    write_json_atomic(out / "export.json", summary)
    return summary


def _export_one(
    model: GatedModel, ranking: Ranking, budget: float, staging: Path, out: Path, *, atol: float, int8: bool, per_channel: bool, log,
) -> dict[str, Any]:
    """Export, check (and with ``int8`` quantize) the graph of one budget into ``staging``; the
    description of it that ``export.json`` lists (file names as they will be in ``out``)."""
    pruned = prune_to_budget(model, ranking, budget).eval()
    path = export_model(pruned, graph_path(staging, budget))
    difference = check_graph(pruned, path, atol=atol)
    graph = {
        "budget": budget,
        "file": path.name,
        "heads_per_layer": pruned.heads_per_layer,
        "groups_per_layer": pruned.groups_per_layer or None,
        "bytes": os.path.getsize(path),
        "max_abs_difference": difference,
    }
    note = ""
    if int8:
        quantized = quantize_graph(path, graph_path(staging, budget, int8=True), per_channel=per_channel)
        check = check_int8_graph(pruned, path, quantized)
        graph["int8"] = {"file": quantized.name, "bytes": os.path.getsize(quantized), "per_channel": per_channel, **check}
        note = f"; int8 {quantized.name}: {os.path.getsize(quantized) / os.path.getsize(path):.0%} of the bytes, argmax agreement {check['argmax_agreement']:.0%} on random inputs"
    log(f"budget {budget:g}: {graph_path(out, budget)} (heads per layer {pruned.heads_per_layer}, max |ORT - torch| = {difference:.1e}{note})")
    return graph
