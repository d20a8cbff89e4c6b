"""Where int8 time goes: ONNX Runtime per-operator time of a dense and a pruned all-MiniLM-L6-v2,
float32 and dynamic int8, at one input shape.

    python benchmarks/int8_profile.py --out runs/int8_profile

Speed depends on the per-layer head and FFN-neuron counts, not on which units or which weights,
so the pruned model keeps the first ``--heads`` heads and ``--ffn`` neurons of each layer of the
offline MiniLM (defaults: the per-layer counts of a trained whole-model MiniLM budgeted-hard
checkpoint at b = 0.5). Each graph is exported and quantized as ``baa export [--int8]`` does,
timed interleaved (1 thread, medians of rounds), then run under ONNX Runtime's profiler; the
table gives, per operator type, microseconds per pass and the ratio dense / pruned, and splits
the pass into matrix products (every ``MatMul``/``Gemm`` kind: the weight products, int8 in the
int8 graphs, and the attention's score and value products, float32 in both) and everything else.
The profiler's own cost inflates small operators: shares, not the benchmark's figures.

Every session leaves off the fusions of ``DISABLED_FUSIONS`` (budgeted_attention.export.onnx), as
``baa bench --onnx`` and ``baa serve`` do; the int8 graphs are also timed and profiled with ONNX
Runtime's full set (``dense-int8-all-fusions``, ``pruned-int8-all-fusions``), which shows what
those fusions cost.

Writes ``int8_profile.json`` and ``int8_profile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from budgeted_attention.export.onnx import DISABLED_FUSIONS, export_model, make_session, quantize_graph
from budgeted_attention.hf.bert import load_gated_bert, minilm_path
from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def time_graphs(paths: dict[str, Path], feed: dict[str, np.ndarray], rounds: int, seconds: float,
                disabled: dict[str, tuple[str, ...]] | None = None) -> dict[str, float]:
    """Median ms per pass of each graph, interleaved round by round (1 thread), in sessions that
    leave off the fusions ``disabled[name]`` (default: ``DISABLED_FUSIONS``, as every command)."""
    disabled = disabled or {}
    sessions = {name: make_session(path, disabled_fusions=disabled.get(name, DISABLED_FUSIONS)) for name, path in paths.items()}
    for session in sessions.values():  # warm-up
        for _ in range(20):
            session.run(None, feed)
    per_round: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for name, session in sessions.items():
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - t0)
            per_round[name].append(1e3 * statistics.median(times))
    return {name: statistics.median(values) for name, values in per_round.items()}


def profile_graph(path: Path, disabled: tuple[str, ...], feed: dict[str, np.ndarray], passes: int, folder: Path, name: str) -> dict[str, float]:
    """Operator type -> µs per pass under ONNX Runtime's profiler (kernel time of every node), the
    fusions ``disabled`` left off."""
    session = make_session(path, disabled_fusions=disabled, profile_prefix=folder / name)
    for _ in range(passes):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            totals[event.get("args", {}).get("op_name", "?")] += float(event["dur"])
    return {op: micros / passes for op, micros in totals.items()}


# The graph kinds, each timed dense and pruned: float32 and int8 in the sessions every command uses,
# and int8 with ONNX Runtime's full fusion set.
KINDS = ("fp32", "int8", "int8-all-fusions")

# Operators whose work shrinks with the kept heads / FFN neurons (the FLOP-ideal counts them); the
# rest (LayerNorm, residual Add, Softmax over kept heads aside) is per-layer fixed cost.
MATMULS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMul", "FusedMatMul", "Gemm", "QGemm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="11,7,3,7,7,11", help="heads kept per layer (of 12)")
    parser.add_argument("--ffn", default="768,384,256,512,768,1152", help="FFN neurons kept per layer (of 1536)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per graph per round")
    parser.add_argument("--passes", type=int, default=200, help="profiled passes per graph")
    parser.add_argument("--repeats", type=int, default=3, help="timings, each in fresh sessions (median and spread reported)")
    parser.add_argument("--per-channel", action="store_true", help="int8 weights per output channel (default: per tensor, ONNX Runtime's default)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    heads, ffn = _ints(args.heads), _ints(args.ffn)
    model = load_gated_bert(minilm_path(), 5, ffn_group_size=128).eval()
    if len(heads) != model.n_layers or len(ffn) != model.n_layers or any(f % 128 for f in ffn):
        parser.error(f"--heads and --ffn need {model.n_layers} values each, FFN counts in multiples of 128")
    pruned = model.pruned_copy([list(range(h)) for h in heads], [list(range(f // 128)) for f in ffn])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    feed = {
        "input_ids": rng.integers(1000, 30000, size=(args.batch_size, args.seq_len), dtype=np.int64),
        "attention_mask": np.ones((args.batch_size, args.seq_len), dtype=np.int64),
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        graphs: dict[str, tuple[Path, tuple[str, ...]]] = {}
        for name, m in (("dense", model), ("pruned", pruned)):
            float_path = export_model(m, folder / f"{name}.onnx")
            int8_path = quantize_graph(float_path, folder / f"{name}.int8.onnx", per_channel=args.per_channel)
            graphs[f"{name}-fp32"] = (float_path, DISABLED_FUSIONS)
            graphs[f"{name}-int8"] = (int8_path, DISABLED_FUSIONS)
            graphs[f"{name}-int8-all-fusions"] = (int8_path, ())
        # Each repeat: fresh sessions, every graph timed interleaved; the speedups' median and spread over repeats.
        paths, fusions_off = {name: path for name, (path, _) in graphs.items()}, {name: off for name, (_, off) in graphs.items()}
        repeats = [time_graphs(paths, feed, args.rounds, args.seconds, fusions_off) for _ in range(args.repeats)]
        latency = {name: statistics.median(r[name] for r in repeats) for name in graphs}
        ops = {name: profile_graph(path, fusions_off[name], feed, args.passes, folder, name) for name, path in paths.items()}
    kinds = {"matmul": MATMULS}
    split = {}
    for name, table in ops.items():
        matmul = sum(v for op, v in table.items() if op in kinds["matmul"])
        split[name] = {"matmul_us": matmul, "rest_us": sum(table.values()) - matmul}
    result = {
        "setting": {"batch_size": args.batch_size, "seq_len": args.seq_len, "threads": 1, "heads": heads, "ffn": ffn,
                    "rounds": args.rounds, "passes": args.passes, "repeats": args.repeats, "per_channel": args.per_channel,
                    "disabled_fusions": list(DISABLED_FUSIONS)},
        "command": ["python", "benchmarks/int8_profile.py", *sys.argv[1:]],
        "environment": environment_info(),
        "latency_ms": latency,
        "speedup": {kind: latency[f"dense-{kind}"] / latency[f"pruned-{kind}"] for kind in KINDS},
        "speedup_repeats": {kind: [r[f"dense-{kind}"] / r[f"pruned-{kind}"] for r in repeats] for kind in KINDS},
        "latency_ms_repeats": repeats,
        "ops_us": ops,
        "split_us": split,
    }
    write_json_atomic(out / "int8_profile.json", result)
    write_text_atomic(out / "int8_profile.md", render(result))
    print(render(result))


def render(result: dict) -> str:
    s, lat, ops, split = result["setting"], result["latency_ms"], result["ops_us"], result["split_us"]
    spread = {kind: f"{min(v):.2f}–{max(v):.2f}x" for kind, v in result["speedup_repeats"].items()}
    recipe = "per output channel" if s.get("per_channel") else "per tensor"
    lines = [
        f"# int8 profile: all-MiniLM-L6-v2 dense vs heads {s['heads']} / FFN {s['ffn']}",
        "",
        f"Generated by `{' '.join(result['command'])}`. Machine: {result['environment'].get('processor')}; batch {s['batch_size']}, "
        f"sequence {s['seq_len']}, 1 thread; onnxruntime {ort.__version__}; int8 weights {recipe}. "
        f"Sessions leave off {', '.join(s.get('disabled_fusions', [])) or 'no fusion'}, except the `all-fusions` rows (ONNX Runtime's full set).",
        "",
        f"| graph | ms per pass (median of {s['repeats']} repeats) | pruned speedup (median; range over repeats) |",
        "|---|---:|---:|",
    ]
    kinds = [kind for kind in KINDS if f"dense-{kind}" in lat]
    for kind in kinds:
        lines.append(f"| dense-{kind} | {lat[f'dense-{kind}']:.3f} | |")
        lines.append(f"| pruned-{kind} | {lat[f'pruned-{kind}']:.3f} | {result['speedup'][kind]:.2f}x ({spread[kind]}) |")
    graphs = [f"{part}-{kind}" for kind in kinds for part in ("dense", "pruned")]
    lines += ["", "Profiled µs per pass by operator type (kernel time; the profiler's cost inflates small operators):", "",
              "| operator | " + " | ".join(g.replace("-", " ") for g in graphs) + " | int8 dense / pruned |", "|---|" + "---:|" * (len(graphs) + 1)]
    names = sorted({op for table in ops.values() for op in table}, key=lambda op: -ops["dense-int8"].get(op, 0.0) - ops["dense-fp32"].get(op, 0.0))
    for op in names:
        cells = [ops[g].get(op, 0.0) for g in graphs]
        dense_int8, pruned_int8 = ops["dense-int8"].get(op, 0.0), ops["pruned-int8"].get(op, 0.0)
        ratio = f"{dense_int8 / pruned_int8:.2f}x" if pruned_int8 > 0 else ""
        lines.append(f"| {op} | " + " | ".join(f"{c:.0f}" for c in cells) + f" | {ratio} |")
    lines += ["", "| graph | matrix products (weights and attention) µs | everything else µs | everything else share |", "|---|---:|---:|---:|"]
    for name, parts in split.items():
        total = parts["matmul_us"] + parts["rest_us"]
        lines.append(f"| {name} | {parts['matmul_us']:.0f} | {parts['rest_us']:.0f} | {parts['rest_us'] / total:.0%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
