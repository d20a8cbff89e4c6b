"""What one head and one FFN group cost on a runtime, against their FLOPs: the ``head_cost_weight``
that makes a budget a fraction of that runtime's time instead of its FLOPs.

    python benchmarks/unit_costs.py --out runs/unit_costs

Speed depends on the per-layer head and FFN-neuron counts, not on which units are kept, so the
offline all-MiniLM-L6-v2 is timed dense and at three pruned shapes (half the heads; half the FFN;
a quarter of each), each exported as ``baa export`` does, in float32 and dynamic int8 ONNX
Runtime graphs, timed interleaved (1 thread, medians of rounds; see ``int8_profile.py``). The
time each shape saves is fitted, by least squares without intercept, as
``heads removed x ms per head + neurons removed x ms per neuron``; a head's weight is its ms per
FLOP over an FFN group's ms per FLOP. 1 means FLOPs price the two kinds alike; above 1, heads
are dearer than their FLOPs say. The fit is repeated in fresh sessions and
the median and spread reported, with each shape's measured and fitted savings. Fit at the
sequence length the budget is converted at (a config's ``reference_seq_len``, else its data's
padded length): attention's share grows with the length, and so does a head's weight.

Writes ``unit_costs.json`` and ``unit_costs.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

GROUP = 128  # FFN neurons per group, as in configs/minilm_bbc_short_all.yaml
SHAPES = {"heads-half": (0.5, 1.0), "ffn-half": (1.0, 0.5), "both-quarter": (0.25, 0.25)}  # fraction of heads, of FFN kept


def fit(savings_ms: list[float], heads_removed: list[int], neurons_removed: list[int]) -> tuple[float, float]:
    """(ms per head, ms per neuron): least squares of ``savings = heads x a + neurons x b``, no intercept."""
    design = np.array([heads_removed, neurons_removed], dtype=np.float64).T
    (per_head, per_neuron), *_ = np.linalg.lstsq(design, np.array(savings_ms, dtype=np.float64), rcond=None)
    return float(per_head), float(per_neuron)


def head_weight(ms_per_head: float, ms_per_neuron: float, head_flops: float, group_flops: float, group_size: int) -> float:
    """A head's ms per FLOP over an FFN group's: the ``head_cost_weight`` of this runtime."""
    if ms_per_head <= 0 or ms_per_neuron <= 0:
        raise ValueError(f"the fit gave {ms_per_head:.4g} ms per head and {ms_per_neuron:.4g} ms per neuron: "
                         "time too noisy to split (more --rounds or --seconds, a quieter machine)")
    return (ms_per_head / head_flops) / (ms_per_neuron * group_size / group_flops)


def main() -> None:
    # Heavy imports here, so the fit and weight functions load with numpy alone (tests).
    import torch

    from budgeted_attention.export.onnx import DISABLED_FUSIONS, export_model, quantize_graph
    from budgeted_attention.hf.bert import load_gated_bert, minilm_path
    from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from int8_profile import time_graphs  # the sibling script's interleaved ONNX Runtime timer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="timing per graph per round")
    parser.add_argument("--repeats", type=int, default=3, help="fits, each timed in fresh sessions (median and spread reported)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.batch_size < 1 or args.seq_len < 1 or args.rounds < 1 or args.repeats < 1 or args.seconds <= 0:
        parser.error("--batch-size, --seq-len, --rounds, --repeats and --seconds must be > 0")
    torch.set_num_threads(1)
    model = load_gated_bert(minilm_path(), 5, ffn_group_size=GROUP).eval()
    if args.seq_len > model.max_len:
        parser.error(f"--seq-len {args.seq_len} exceeds the model's max_len {model.max_len}")
    n_heads, d_ff = model.n_heads, model.n_groups * GROUP
    cost = model.cost_model(args.seq_len)
    head_flops, group_flops = cost.head_flops(), cost.group_flops(GROUP)
    shapes = {"dense": (n_heads, d_ff)}
    shapes.update({name: (max(1, round(h * n_heads)), max(GROUP, round(f * d_ff / GROUP) * GROUP)) for name, (h, f) in SHAPES.items()})
    rng = np.random.default_rng(0)
    feed = {
        "input_ids": rng.integers(model.first_ordinary_id(), model.vocab_size, size=(args.batch_size, args.seq_len), dtype=np.int64),
        "attention_mask": np.ones((args.batch_size, args.seq_len), dtype=np.int64),
    }
    removed = {name: ((n_heads - h) * model.n_layers, (d_ff - f) * model.n_layers) for name, (h, f) in shapes.items() if name != "dense"}
    result: dict = {
        "setting": {"batch_size": args.batch_size, "seq_len": args.seq_len, "threads": 1, "rounds": args.rounds,
                    "seconds": args.seconds, "repeats": args.repeats, "group_size": GROUP, "disabled_fusions": list(DISABLED_FUSIONS),
                    "shapes": {name: {"heads_per_layer": h, "ffn_per_layer": f} for name, (h, f) in shapes.items()}},
        "command": ["python", "benchmarks/unit_costs.py", *sys.argv[1:]],
        "environment": environment_info(),
        "flops": {"head": head_flops, "group": group_flops},
        "runtimes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = {}
        for name, (h, f) in shapes.items():
            pruned = model if name == "dense" else model.pruned_copy(
                [list(range(h))] * model.n_layers, [list(range(f // GROUP))] * model.n_layers)
            paths[f"{name}-fp32"] = export_model(pruned, folder / f"{name}.onnx")
            paths[f"{name}-int8"] = quantize_graph(paths[f"{name}-fp32"], folder / f"{name}.int8.onnx")
        repeats = [time_graphs(paths, feed, args.rounds, args.seconds) for _ in range(args.repeats)]
    for runtime in ("fp32", "int8"):
        fits = []
        for latency in repeats:
            savings = [latency[f"dense-{runtime}"] - latency[f"{name}-{runtime}"] for name in removed]
            per_head, per_neuron = fit(savings, [r[0] for r in removed.values()], [r[1] for r in removed.values()])
            try:
                weight = head_weight(per_head, per_neuron, head_flops, group_flops, GROUP)
            except ValueError as exc:
                sys.exit(f"unit_costs: {runtime}: {exc}")
            fitted = {name: per_head * r[0] + per_neuron * r[1] for name, r in removed.items()}
            fits.append({"ms_per_head": per_head, "ms_per_group": per_neuron * GROUP, "head_cost_weight": weight,
                         "savings_ms": dict(zip(removed, savings)), "fitted_savings_ms": fitted, "latency_ms": {
                             name: latency[f"{name}-{runtime}"] for name in shapes}})
        weights = [f["head_cost_weight"] for f in fits]
        result["runtimes"][runtime] = {"head_cost_weight": statistics.median(weights), "range": [min(weights), max(weights)], "fits": fits,
                                       "median_fit": sorted(range(len(fits)), key=lambda i: weights[i])[(len(fits) - 1) // 2]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "unit_costs.json", result)
    write_text_atomic(out / "unit_costs.md", render(result))
    print(render(result))


def render(result: dict) -> str:
    s = result["setting"]
    env = result["environment"]
    lines = [
        "## Unit costs: all-MiniLM-L6-v2 in ONNX Runtime", "",
        f"Generated by `{' '.join(result['command'])}`. Machine: {env.get('processor') or env.get('machine')}; "
        f"batch {s['batch_size']}, sequence {s['seq_len']}, 1 thread; {s['repeats']} fits, each timed in fresh sessions.", "",
        "| runtime | head_cost_weight (median) | range over fits | ms per head | ms per FFN group of "
        f"{s['group_size']} |", "|---|---:|---:|---:|---:|",
    ]
    for runtime, r in result["runtimes"].items():
        mid = r["fits"][r["median_fit"]]
        lines.append(f"| {runtime} | {r['head_cost_weight']:.2f} | {r['range'][0]:.2f}–{r['range'][1]:.2f} | "
                     f"{mid['ms_per_head']:.4f} | {mid['ms_per_group']:.4f} |")
    lines += ["", f"FLOPs of one head {result['flops']['head']:,}, of one FFN group {result['flops']['group']:,}. "
              "Savings against the dense graph, measured and fitted (the fit at the median weight; the lower middle one "
              "for an even number of fits):", "",
              "| runtime | shape | heads, FFN per layer | dense ms | ms | saved ms | fitted saved ms |", "|---|---|---|---:|---:|---:|---:|"]
    for runtime, r in result["runtimes"].items():
        mid = r["fits"][r["median_fit"]]
        for name, saved in mid["savings_ms"].items():
            shape = s["shapes"][name]
            lines.append(f"| {runtime} | {name} | {shape['heads_per_layer']}, {shape['ffn_per_layer']} | {mid['latency_ms']['dense']:.3f} | "
                         f"{mid['latency_ms'][name]:.3f} | {saved:.3f} | {mid['fitted_savings_ms'][name]:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
