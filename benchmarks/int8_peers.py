"""Budgets composed with int8, against what users pick instead: accuracy and latency of one run's models.

    python benchmarks/int8_peers.py runs/minilm_bbc_short_int8 --out runs/int8_minilm

For every seed of the run directory (``--seeds``), in one process, on the same inputs and thread count:

* ``reference-fp32``: the unmodified library model of the dense fine-tune (transformers for the
  BERT family; the family's own dense lean executor where there is no library model);
* ``dense-onnx-fp32`` and ``dense-onnx-int8``: the dense fine-tune exported to ONNX Runtime, float
  and dynamically quantized (the Optimum-style recipe);
* ``budgeted-hard`` (PyTorch lean executor, float), ``budgeted-hard-onnx-fp32`` and
  ``budgeted-hard-int8`` at each budget: the run's budgeted-hard model pruned to it;
* with ``--peers``, each peer run's dense fine-tune of a smaller pretrained model (e.g. the
  bottom layers of the same checkpoint, benchmarks/truncate_pretrained.py) as ``smaller-fp32``
  (its unmodified library model), ``smaller-onnx-fp32`` and ``smaller-int8``, its budget column
  holding its forward FLOPs over the big model's: the accuracy-latency curve a user gets by
  picking a smaller model instead of a budget. A peer must share the run's tokenizer and data.

Accuracy is each model's own predictions on the run's test split (the int8 graph's, not the
float model's), split exactly as the run split it; ``agreement`` is the share of test texts where
an int8 graph predicts what its float graph predicts. Latency: interleaved
``torch.utils.benchmark`` medians (ONNX Runtime sessions with the same intra-op threads and
graph optimizations, those of ``baa bench --onnx``: every one but ``DISABLED_FUSIONS``), random
ids of ``--seq-len`` tokens at each ``--batch-sizes``, and the test texts at their own lengths
(batches of 32, padded to their longest); a model with fewer positions than ``--seq-len`` is timed at
its ``max_len``. ``speedup`` is the reference's latency over the row's at
batch 1, ``--seq-len`` tokens. Nothing here picks a budget or a model: every row is reported.
Writes ``results.json`` (rows in the sweep schema, so ``baa report`` renders them),
``int8_peers.json`` (every latency), ``accuracy_vs_latency.png`` and ``run_info.json``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.checkpoint import load_model, load_ranking
from budgeted_attention.config import from_dict, load_yaml
from budgeted_attention.data.inputs import random_ids
from budgeted_attention.data.sources import load_source
from budgeted_attention.data.text import TextDataConfig, split_examples
from budgeted_attention.export.onnx import DISABLED_FUSIONS, export_model, make_session, quantize_graph
from budgeted_attention.io import environment_info, write_json_atomic
from budgeted_attention.pruning.surgery import prune_to_budget
from budgeted_attention.reporting.plots import plot_accuracy_vs_latency
from budgeted_attention.rundir import RunDir, resume_script
from budgeted_attention.serving.engine import load_tokenizer

EVAL_BATCH = 32


def _batches(tokenizer, pad_id: int, texts: list[str], batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, mask) batches of ``texts`` in order, each right-padded to its longest text."""
    out = []
    for start in range(0, len(texts), batch):
        encoded = [e.ids for e in tokenizer.encode_batch(texts[start : start + batch])]
        length = max(len(x) for x in encoded)
        ids = torch.full((len(encoded), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), length), dtype=torch.long)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        out.append((ids, mask))
    return out


def _torch_runner(module: torch.nn.Module):
    def call(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return module(ids, mask)

    return call


def _onnx_runner(session):
    def call(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])

    return call


def _predictions(call, batches) -> torch.Tensor:
    return torch.cat([call(ids, mask).argmax(-1) for ids, mask in batches])


def _timed(call, batches):
    def run() -> None:
        for ids, mask in batches:
            call(ids, mask)

    return run


def _peer_model(peer: RunDir, seed: int, run: RunDir):
    """The dense fine-tune of ``seed`` in the peer run; refused unless it shares the run's tokenizer."""
    if peer.tokenizer.read_bytes() != run.tokenizer.read_bytes():
        raise SystemExit(f"int8_peers: peer '{peer.path}' has another tokenizer than '{run.path}' (it must encode the same test split)")
    if load_yaml(peer.config)["data"] != load_yaml(run.config)["data"]:
        raise SystemExit(f"int8_peers: peer '{peer.path}' has another data section than '{run.path}'")
    model, _ = load_model(peer.checkpoint_description(seed, "dense"))
    return model.eval()


def measure_seed(run: RunDir, seed: int, budgets: list[float], batch_sizes: list[int], seq_len: int, threads: int, rounds: int,
                 min_run_time: float, folder: Path, peers: list[RunDir] = (), log=print, per_channel: bool = False) -> tuple[list[dict], dict]:
    """The rows of one seed and its latency table ``{setting: {system: ms per batch}}`` (int8
    weights per output channel with ``per_channel``, else per tensor)."""
    dense, _ = load_model(run.checkpoint_description(seed, "dense"))
    hard_path = run.checkpoint_description(seed, "budgeted-hard")
    hard, description = load_model(hard_path)
    ranking = load_ranking(hard_path, description, hard)
    dense, hard = dense.eval(), hard.eval()
    data = from_dict(TextDataConfig, load_yaml(run.config)["data"], "data")
    tokenizer, pad_id = load_tokenizer(run.path, min(int(data.max_len), int(dense.max_len)))  # truncated as the run encoded its test split
    seq_len = min(seq_len, int(dense.max_len))  # a model of fewer positions is timed at its max_len (the rows say which)
    _, _, test = split_examples(data, load_source(data))
    labels = torch.tensor([e.label for e in test])
    test_batches = _batches(tokenizer, pad_id, [e.text for e in test], EVAL_BATCH)

    library = next(iter(dense.library_references().items()), None)
    reference_name = f"{library[0]} fp32 (unmodified library model)" if library else f"{type(dense.inference_module()).__name__} fp32 (dense lean executor)"
    systems: dict[str, tuple[str, float, object]] = {"reference-fp32": ("reference-fp32", 1.0, _torch_runner(library[1].eval() if library else dense.inference_module()))}
    graphs: dict[str, tuple[str, float, torch.nn.Module]] = {"dense": ("dense", 1.0, dense)}
    for b in budgets:
        graphs[f"budgeted-hard@{b:g}"] = ("budgeted-hard", b, prune_to_budget(copy.deepcopy(hard), ranking, b).eval())
    peer_names: dict[str, str] = {}
    for peer in peers:
        small = _peer_model(peer, seed, run)
        fraction = small.cost_model(seq_len).total_flops() / dense.cost_model(seq_len).total_flops()
        key = f"smaller@{peer.path.name}"
        graphs[key] = ("smaller", round(fraction, 4), small)
        peer_names[key] = peer.path.name
        small_library = next(iter(small.library_references().values()), None)
        systems[key] = ("smaller-fp32", round(fraction, 4), _torch_runner(small_library.eval() if small_library is not None else small.inference_module()))
    agreement: dict[str, float] = {}
    kept: dict[str, torch.nn.Module] = {}
    for key, (method, b, model) in graphs.items():
        float_path = export_model(model, folder / f"seed{seed}-{key}.onnx")
        int8_path = quantize_graph(float_path, folder / f"seed{seed}-{key}.int8.onnx", per_channel=per_channel)
        float_call, int8_call = _onnx_runner(make_session(float_path, threads)), _onnx_runner(make_session(int8_path, threads))
        if method == "budgeted-hard":
            systems[key] = (method, b, _torch_runner(model.inference_module()))
            kept[key] = model
        systems[f"{key}|onnx-fp32"] = (f"{method}-onnx-fp32", b, float_call)
        systems[f"{key}|int8"] = (f"{method}-int8", b, int8_call)
    log(f"seed {seed}: exported and quantized {len(graphs)} graphs")

    predictions = {name: _predictions(call, test_batches) for name, (_, _, call) in systems.items()}
    for key in graphs:
        agreement[key] = float((predictions[f"{key}|int8"] == predictions[f"{key}|onnx-fp32"]).float().mean())

    settings = {f"batch {b}, seq {seq_len}": [(random_ids(int(dense.input_embedding().num_embeddings), b, seq_len, seed=seed, low=dense.first_ordinary_id()),
                                               torch.ones(b, seq_len, dtype=torch.long))] for b in batch_sizes}
    settings[f"test texts, batches of {EVAL_BATCH}"] = test_batches
    latency: dict[str, dict[str, float]] = {}
    for label, batches in settings.items():
        functions = {name: _timed(call, batches) for name, (_, _, call) in systems.items()}
        ms = measure_interleaved(functions, threads=threads, rounds=rounds, min_run_time=min_run_time)
        latency[label] = {name: value / len(batches) for name, value in ms.items()}
        log(f"seed {seed}, {label}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in latency[label].items()))

    headline_batch = 1 if 1 in batch_sizes else batch_sizes[0]  # the rows' latency and speedup: batch 1 unless it was not timed
    headline = f"batch {headline_batch}, seq {seq_len}"
    rows = []
    for name, (method, b, _) in systems.items():
        graph = name.split("|")[0]
        base = graph if graph in graphs else None
        row = {
            "method": method, "budget": b, "seed": seed,
            "accuracy": float((predictions[name] == labels).float().mean()),
            "latency_ms": latency[headline][name], "dense_latency_ms": latency[headline]["reference-fp32"],
            "speedup": latency[headline]["reference-fp32"] / latency[headline][name],
            "bench_input": "random", "bench_batch_size": headline_batch, "bench_seq_len": seq_len, "threads": threads,
            "latencies_ms": {label: table[name] for label, table in latency.items()},
        }
        if name.endswith("|int8") and base is not None:
            row["agreement_with_float"] = agreement[base]
            row["speedup_over_dense_int8"] = latency[headline]["dense|int8"] / latency[headline][name]
        if graph in peer_names:
            row["variant"] = peer_names[graph]  # a point of the smaller-model curve (its budget column: its FLOP fraction)
        model = kept.get(name)
        if model is not None:
            row["heads_per_layer"] = model.heads_per_layer
            if library is None:  # the FLOP-ideal only where the reference is the same runtime's dense model (the lean executor), not another library's
                row["ideal_speedup"] = hard.cost_model(seq_len).ideal_speedup(model.heads_per_layer, model.active_ffn_widths())
        rows.append(row)
    return rows, {"reference": reference_name, "latency_ms": latency, "agreement_with_float": agreement}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory of 'baa experiment' with dense and budgeted-hard checkpoints (a family with ONNX export)")
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--seeds", default="", help="comma-separated seeds (default: every seed of the run)")
    parser.add_argument("--budgets", default="0.25,0.5,0.75")
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-run-time", type=float, default=0.3)
    parser.add_argument("--per-channel", action="store_true", help="int8 weights per output channel (default: per tensor, ONNX Runtime's default)")
    parser.add_argument("--peers", default="", help="comma-separated run directories of smaller pretrained models' dense fine-tunes (same seeds, tokenizer and data)")
    parser.add_argument("--force", action="store_true", help="measure anew even when --out holds this measurement already")
    args = parser.parse_args(argv)
    if (done := resume_script(args.out, "benchmarks/int8_peers.py", list(argv if argv is not None else sys.argv[1:]), args.force,
                              sources=(args.run_dir, *(p for p in args.peers.split(",") if p)))) is not None:
        return done
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    run = RunDir(args.run_dir)
    if not run.config.is_file():
        raise SystemExit(f"int8_peers: '{args.run_dir}' is not a run directory of 'baa experiment' (no {RunDir.config.name})")
    seeds = [int(s) for s in args.seeds.split(",") if s] or run.seeds()
    peers = [RunDir(p) for p in args.peers.split(",") if p]
    for peer in peers:
        missing = [s for s in seeds if s not in peer.seeds()] if peer.config.is_file() else seeds
        if missing:
            raise SystemExit(f"int8_peers: peer '{peer.path}' has no dense fine-tune of seeds {missing}")
    budgets = [float(b) for b in args.budgets.split(",") if b]
    started = time.perf_counter()
    rows: list[dict] = []
    details: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="baa-int8-") as folder:
        for seed in seeds:
            seed_rows, detail = measure_seed(run, seed, budgets, [int(b) for b in args.batch_sizes.split(",")], args.seq_len, args.threads,
                                             args.rounds, args.min_run_time, Path(folder), peers, per_channel=args.per_channel)
            rows += seed_rows
            details[str(seed)] = detail
    out = RunDir(args.out)
    out.path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out.path / "int8_peers.json", {"source_run": str(args.run_dir), "seeds": details, "setting": vars(args)})
    plot_accuracy_vs_latency(rows, out.path / "accuracy_vs_latency.png", out.path.name)
    write_json_atomic(out.results_json, {"rows": rows})  # then run_info.json, last: what a resumed study reads as done
    write_json_atomic(out.run_info, {"seeds": seeds, "command": ["python", "benchmarks/int8_peers.py", *(argv or sys.argv[1:])],
                                     "environment": environment_info(), "onnxruntime_disabled_fusions": list(DISABLED_FUSIONS),
                                     "wall_s": time.perf_counter() - started})
    print(f"wrote {out.results_json} ({len(rows)} rows, {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
