"""``baa bench``: latency of dense vs pruned models of any family, for several budgets and inputs.

Written once against :class:`budgeted_attention.model.family.GatedModel`. Every model is timed
through its family's lean executor (:meth:`GatedModel.inference_module`, the inference path), so
the like-for-like baseline is the lean executor of the unpruned model at b = 1; the unmodified
library model (``library_references()``, e.g. transformers), what users run instead, is timed in
the same interleaved rounds where the family has one. Each row reports ``speedup`` (the pruned
lean executor over the dense one) and ``library_speedup`` (over the library model), plus
``onnx_speedup`` with ONNX Runtime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from budgeted_attention.benchmark.allocator import keep_freed_memory
from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.latency import cuda_graph, measure_interleaved, measure_interleaved_cuda, time_call
from budgeted_attention.data.inputs import length_batches, random_ids
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import KeptUnits, Ranking
from budgeted_attention.pruning.switching import SlicedModel

# Batches per timed call in the real-lengths mode: one call runs them all (latency is per batch).
LENGTH_BATCHES = 8


def speed_row(
    budget: float, batch: int, seq: int, threads: int, dense_ms: float, pruned_ms: float, heads: list[int], cost: CostModel,
    ffn_widths: list[int] | None = None,
) -> dict[str, Any]:
    """One benchmark row: latencies, measured and FLOP-ideal speedups and their ratio.

    ``ffn_widths``: FFN neurons per layer of the pruned model (None: the FFN is whole, scope heads).
    """
    ideal = cost.ideal_speedup(list(heads), ffn_widths)
    speedup = dense_ms / pruned_ms
    return {
        "budget": budget,
        "scope": "heads" if ffn_widths is None else "all",
        "batch_size": batch,
        "seq_len": seq,
        "threads": threads,
        "dense_latency_ms": dense_ms,
        "latency_ms": pruned_ms,
        "speedup": speedup,
        "ideal_speedup": ideal,
        "efficiency": speedup / ideal,
        "heads_kept": sum(heads),
        "heads_per_layer": list(heads),
        "ffn_per_layer": None if ffn_widths is None else list(ffn_widths),
        "flops_fraction": cost.total_flops(list(heads), ffn_widths) / cost.total_flops(),
    }


def _key(budget: float, scope: str) -> str:
    return f"{scope}_{budget}"


def _input_settings(model: GatedModel, cfg: BenchConfig, vocab_size: int, lengths: list[int] | None, pad_id: int, low: int | None):
    """(label, batch, seq, list of (ids, mask)) per timed input shape; ids from ``low`` (None: the
    model's first ordinary token id, so no input draws the pad or another special id) up."""
    low = min(model.first_ordinary_id() if low is None else low, vocab_size // 2)  # tiny test vocabularies: capped
    settings = []
    for batch in cfg.batch_sizes:
        for seq in cfg.seq_lens:
            settings.append(("random", batch, seq, [(random_ids(vocab_size, batch, seq, low=low), None)]))
        if lengths:
            batches = length_batches(lengths, batch, LENGTH_BATCHES, vocab_size, pad_id=pad_id, low=low)
            mean_padded = round(sum(ids.shape[1] for ids, _ in batches) / len(batches))
            settings.append(("lengths", batch, mean_padded, batches))
    return settings


def _runner(module: Callable[..., Any], batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> Callable[[], None]:
    def run() -> None:
        for ids, mask in batches:
            module(ids, mask)

    return run


def _onnx_runners(
    model: GatedModel, pruned: dict[str, tuple[float, GatedModel, bool]], keys: list[str], threads: int, folder: str, int8: bool = False,
) -> dict[str, Callable[[list[tuple[torch.Tensor, torch.Tensor | None]]], Callable[[], None]]]:
    """ONNX Runtime sessions of the dense model (``onnx_dense``) and of the pruned models ``keys``
    (``onnx_<key>``), with ``int8`` also of their int8 quantizations (``int8_dense``,
    ``int8_<key>``), as factories of zero-argument runners over a list of batches."""
    from budgeted_attention.export.onnx import export_model, make_session, quantize_graph  # noqa: PLC0415 - onnx and onnxruntime are optional: only with --onnx

    graphs = {"onnx_dense": model}
    graphs.update({f"onnx_{key}": pruned[key][1] for key in keys})
    paths = {name: export_model(m, f"{folder}/{name}.onnx") for name, m in graphs.items()}
    if int8:
        paths |= {name.replace("onnx_", "int8_", 1): quantize_graph(path, f"{folder}/{name}.int8.onnx") for name, path in list(paths.items())}
    sessions = {name: make_session(path, threads) for name, path in paths.items()}

    def factory(session):
        def make(batches):
            feeds = [
                {"input_ids": ids.numpy(), "attention_mask": (torch.ones_like(ids) if mask is None else mask).numpy()}
                for ids, mask in batches
            ]

            def run() -> None:
                for feed in feeds:
                    session.run(None, feed)

            return run

        return make

    return {name: factory(session) for name, session in sessions.items()}


def bench_models(
    model: GatedModel,
    kept_by_budget: dict[float, KeptUnits],
    cfg: BenchConfig,
    *,
    ranking: Ranking | None = None,
    extra_kept: dict[float, KeptUnits] | None = None,
    lengths: list[int] | None = None,
    vocab_size: int | None = None,
    pad_id: int = 0,
    low_id: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Time the lean executors of the dense model (b = 1) and of one pruned model per budget,
    and the library model where the family has one.

    Args:
        model: the full (unpruned) gated model.
        kept_by_budget: budget -> :class:`KeptUnits` (heads and FFN groups, e.g. ``ranking.kept(b)``).
        extra_kept: more pruned models timed in the same rounds (rows marked by their scope), e.g.
            head-only pruning of an ``all``-scope ranking for a side-by-side comparison.
        cfg: batch sizes, padded sequence lengths, threads, rounds.
        ranking: when given (and ``cfg.include_sliced``), the sliced layout's budget switch is timed.
        lengths: real token counts of a data set; adds padded batches sampled from them.
        vocab_size, pad_id, low_id: id range of the random inputs (``low_id`` None: the model's
            :meth:`~budgeted_attention.model.family.GatedModel.first_ordinary_id`).

    Returns:
        ``{"rows", "switch"?, "setting"}``; each row has ``budget, scope, input, batch_size,
        seq_len, threads, dense_latency_ms, latency_ms, speedup, ideal_speedup, efficiency,
        heads_kept, heads_per_layer, ffn_per_layer, flops_fraction``, with a library model
        ``library, library_latency_ms, library_speedup``, with ONNX ``onnx_dense_latency_ms,
        onnx_latency_ms, onnx_speedup, onnx_efficiency``, with int8 ``int8_dense_latency_ms,
        int8_latency_ms, int8_speedup`` (over the dense int8 graph) and ``int8_library_speedup``
        (over the float library model).

    Raises:
        BAAError: the model has something its family's lean executor does not run (named).
    """
    model = model.eval()
    if model.is_pruned:
        raise ValueError("bench needs the full model (the dense baseline and the library model are built from it)")
    check_lengths(model, cfg.seq_lens, "bench sequence length")
    if lengths and max(lengths) > model.max_len:
        raise ValueError(f"the data's longest example ({max(lengths)} tokens) exceeds the model's max_len {model.max_len}")
    vocab = vocab_size or _vocab_size(model)
    device = _bench_device(cfg)
    library = next(iter(model.library_references().items()), None)  # (name, module): what users run instead
    if library is not None:
        library = library[0], library[1].eval().to(device)
    # Only its budget switch is timed (set_active on the sorted layout), so no lean executor is built for it.
    sliced = SlicedModel(model, ranking, lean=False).eval() if (ranking is not None and cfg.include_sliced) else None
    pruned: dict[str, tuple[float, GatedModel, bool]] = {}  # key -> (budget, model, FFN pruned)
    for b, units in list(kept_by_budget.items()) + list((extra_kept or {}).items()):
        pruned[_key(b, units.scope)] = (b, model.pruned_copy(units.heads, units.groups).to(device), units.scope == "all")
    model = model.to(device)  # moved back to the CPU at the end
    lean = {"dense": model.inference_module(), **{key: pm.inference_module() for key, (_, pm, _) in pruned.items()}}
    main_keys = [_key(b, units.scope) for b, units in kept_by_budget.items()]
    try:
        with tempfile.TemporaryDirectory(prefix="baa-bench-onnx-") as folder:
            onnx = _onnx_runners(model, pruned, main_keys, cfg.threads, folder, cfg.int8) if cfg.onnx else {}
            rows = _time_settings(model, lean, library, pruned, onnx, cfg, _input_settings(model, cfg, vocab, lengths, pad_id, low_id), progress)
    finally:
        model.to("cpu")  # the caller's model, moved to the timing device above
    result: dict[str, Any] = {
        "rows": rows,
        "setting": {
            "threads": cfg.threads,
            "rounds": cfg.rounds,
            "min_run_time_s": cfg.min_run_time,
            "timer": "torch.utils.benchmark blocked_autorange, interleaved, median of round medians"
            + (", torch.compile of the lean executors and the library model" if cfg.compile else ""),
            "compile": cfg.compile,
            "allocator": keep_freed_memory(),
            "dense_reference": f"{type(lean['dense']).__name__} at b = 1: the family's lean executor of the unpruned model, as every pruned model runs",
            "library": None if library is None else library[0],
            "length_batches": LENGTH_BATCHES if lengths else 0,
            "family": model.family,
            "onnx": f"onnxruntime {_ort_version()}, {cfg.threads} intra-op thread(s), {_ort_fusions()}, b = 1 graph as its reference" if cfg.onnx else None,
            "int8": "dynamic int8 (onnxruntime.quantization.quantize_dynamic: int8 MatMul/Gemm weights per tensor, uint8 activations), the b = 1 int8 graph as its reference" if cfg.int8 else None,
        },
    }
    if cfg.device == "cuda":
        result["setting"]["timer"] = (
            f"CUDA events on {torch.cuda.get_device_name(device)}, interleaved, median of round medians"
            + (", torch.compile" if cfg.compile else "") + (", CUDA graphs" if cfg.cuda_graphs else "")
        )
        result["setting"]["device"] = "cuda"
    if sliced is not None:
        budgets = sorted(kept_by_budget) if len(kept_by_budget) > 1 else sorted(kept_by_budget) + [1.0]
        state = {"i": 0}

        def switch() -> None:
            state["i"] += 1
            sliced.set_budget(budgets[state["i"] % len(budgets)])

        result["switch"] = {"switch_ms": time_call(switch, repeats=2000), "budgets": budgets}
    return result


def _bench_device(cfg: BenchConfig) -> torch.device:
    """The timing device (``ValueError`` naming the problem when CUDA is asked for and absent)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("bench device 'cuda' requested but no CUDA GPU is available (torch.cuda.is_available() is False)")
    return torch.device(cfg.device)


def _compiler(cfg: BenchConfig) -> Callable[[torch.nn.Module], Callable[..., Any]]:
    """``torch.compile`` when asked for (memoised per module: each shape compiles once), else identity."""
    if not cfg.compile:
        return lambda module: module
    # Every pruned model shares one forward function, and each (model, input shape) is its own
    # graph; past dynamo's default limit of 8 per function the rest would silently run eager.
    # (``cache_size_limit`` is the name on every torch version we support; newer ones alias it.)
    import torch._dynamo.config as dynamo_config  # noqa: PLC0415 - the compiler stack only with --compile

    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 256)
    dynamo_config.accumulated_cache_size_limit = max(dynamo_config.accumulated_cache_size_limit, 4096)
    cache: dict[int, Callable[..., Any]] = {}

    def compiled(module: torch.nn.Module) -> Callable[..., Any]:
        if id(module) not in cache:
            cache[id(module)] = torch.compile(module, dynamic=False)
        return cache[id(module)]

    return compiled


def _measure(functions: dict[str, Callable[[], None]], cfg: BenchConfig) -> dict[str, float]:
    """Median ms per call: CUDA events (optionally CUDA-graph replays) on the GPU, torch.utils.benchmark on the CPU."""
    if cfg.device == "cuda":
        if cfg.cuda_graphs:
            functions = {name: cuda_graph(fn) for name, fn in functions.items()}
        return measure_interleaved_cuda(functions, rounds=cfg.rounds)
    return measure_interleaved(functions, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time)


def _time_settings(
    model: GatedModel, lean: dict[str, torch.nn.Module], library, pruned, onnx, cfg: BenchConfig, settings, progress: bool,
) -> list[dict[str, Any]]:
    """Time every candidate on each input setting, interleaved; the speed rows."""
    rows: list[dict[str, Any]] = []
    device = _bench_device(cfg)
    compiled = _compiler(cfg)
    for label, batch, seq, batches in tqdm(settings, desc="bench", disable=not progress, leave=False):
        batches = [(ids.to(device), None if mask is None else mask.to(device)) for ids, mask in batches]
        functions: dict[str, Callable[[], None]] = {f"lean_{key}": _runner(compiled(module), batches) for key, module in lean.items()}
        if library is not None:
            functions["library"] = _runner(compiled(library[1]), batches)
        for name, make in onnx.items():
            functions[name] = make(batches)
        latency = {k: v / len(batches) for k, v in _measure(functions, cfg).items()}
        cost = model.cost_model(seq)
        for key, (b, pm, ffn_pruned) in pruned.items():
            pruned_ms = latency[f"lean_{key}"]
            widths = pm.active_ffn_widths() if ffn_pruned else None
            row = {"input": label, **speed_row(b, batch, seq, cfg.threads, latency["lean_dense"], pruned_ms, pm.heads_per_layer, cost, widths)}
            if library is not None:
                row.update(library=library[0], library_latency_ms=latency["library"], library_speedup=latency["library"] / pruned_ms)
            if f"onnx_{key}" in latency:  # ONNX Runtime: the pruned graph against the dense graph
                row["onnx_dense_latency_ms"] = latency["onnx_dense"]
                row["onnx_latency_ms"] = latency[f"onnx_{key}"]
                row["onnx_speedup"] = latency["onnx_dense"] / latency[f"onnx_{key}"]
                row["onnx_efficiency"] = row["onnx_speedup"] / row["ideal_speedup"]
            if f"int8_{key}" in latency:  # int8: the pruned int8 graph against the dense int8 graph and the float library model
                row["int8_dense_latency_ms"] = latency["int8_dense"]
                row["int8_latency_ms"] = latency[f"int8_{key}"]
                row["int8_speedup"] = latency["int8_dense"] / latency[f"int8_{key}"]
                if library is not None:
                    row["int8_library_speedup"] = latency["library"] / latency[f"int8_{key}"]
            rows.append(row)
    return rows


def bench_against_reference(
    model: GatedModel,
    candidates: dict[str, GatedModel],
    cfg: BenchConfig,
    *,
    lengths: list[int] | None = None,
    vocab_size: int | None = None,
    pad_id: int = 0,
    low_id: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Time other models (e.g. separately trained smaller encoders) against ``model``, each
    through its lean executor, interleaved in the same rounds and on the same inputs as
    :func:`bench_models`.

    Returns one row per (candidate, input setting): ``name, input, batch_size, seq_len, threads,
    dense_latency_ms, latency_ms, speedup``.
    """
    vocab = vocab_size or _vocab_size(model)
    dense = model.eval().inference_module()
    lean = {name: candidate.eval().inference_module() for name, candidate in candidates.items()}
    rows = []
    for label, batch, seq, batches in tqdm(_input_settings(model, cfg, vocab, lengths, pad_id, low_id), desc="bench", disable=not progress, leave=False):
        functions: dict[str, Callable[[], None]] = {"dense": _runner(dense, batches)}
        for name, executor in lean.items():
            functions[name] = _runner(executor, batches)
        latency = {k: v / len(batches) for k, v in measure_interleaved(
            functions, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time
        ).items()}
        for name in candidates:
            rows.append({
                "name": name, "input": label, "batch_size": batch, "seq_len": seq, "threads": cfg.threads,
                "dense_latency_ms": latency["dense"], "latency_ms": latency[name], "speedup": latency["dense"] / latency[name],
            })
    return rows


def bench_ranking(model: GatedModel, ranking: Ranking, cfg: BenchConfig, **kwargs: Any) -> dict[str, Any]:
    """:func:`bench_models` at ``cfg.budgets`` with the kept sets of one nested ranking (and the sliced layout).

    For an ``all``-scope ranking, head-only pruning at the same budgets (its head order, the FFN
    whole) is timed in the same rounds, so both scopes stand side by side.
    """
    kept = {b: ranking.kept(b) for b in cfg.budgets}
    extra = None
    if ranking.n_groups:
        heads_only = ranking.heads_only()
        extra = {b: heads_only.kept(b) for b in cfg.budgets}
    return bench_models(model, kept, cfg, ranking=ranking, extra_kept=extra, **kwargs)


def _ort_version() -> str:
    import onnxruntime  # noqa: PLC0415 - optional: only with --onnx

    return onnxruntime.__version__


def _ort_fusions() -> str:
    from budgeted_attention.export.onnx import DISABLED_FUSIONS  # noqa: PLC0415 - with --onnx only, as the runners

    return "every graph optimization" + (f" but {', '.join(DISABLED_FUSIONS)}" if DISABLED_FUSIONS else "")


def check_lengths(model: GatedModel, seq_lens: list[int], what: str) -> None:
    """Every length must fit the model's position embeddings (ValueError naming the length)."""
    for seq in seq_lens:
        if seq > model.max_len:
            raise ValueError(f"{what} {seq} exceeds the model's max_len {model.max_len}")


def _vocab_size(model: GatedModel) -> int:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "vocab_size"):
        return int(config.vocab_size)
    return int(model.hf.config.vocab_size)  # type: ignore[attr-defined]
