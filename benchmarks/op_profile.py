"""Where a pruned model's time goes: per-operator time of the dense and the pruned lean copies.

    python benchmarks/op_profile.py runs/d256_all_skip --budget 0.25 --batch-size 1 --seq-len 128

The FLOP-ideal speedup counts matrix products (and the attention's score / value products); the
operators that do not shrink with the budget (LayerNorms, residual adds, embedding, copies of
Q/K/V for the attention kernel, the per-call cost of every operator) are what keeps a small pass
below it. This script runs the budgeted-hard checkpoint of a run directory dense and pruned at one
budget through the family's lean copies under ``torch.profiler`` (1 thread) and prints, per
operator, microseconds per pass and calls per pass, the ratio dense / pruned, and the split into
matrix products and everything else.

The profiler's own cost inflates small operators, so these are shares, not the benchmark's
figures; ``baa bench`` times the same models without it.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from budgeted_attention.benchmark.allocator import keep_freed_memory
from budgeted_attention.checkpoint import load_model, load_ranking
from budgeted_attention.data.inputs import random_ids
from budgeted_attention.rundir import RunDir

# The kernels doing the work the cost model counts as FLOPs (self time; the wrappers that call them,
# such as aten::linear or aten::scaled_dot_product_attention, are per-call cost and count as "everything else").
MATMUL_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def profile_ops(module: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, iterations: int) -> dict[str, tuple[float, float]]:
    """Operator name -> (self CPU µs per pass, calls per pass) over ``iterations`` passes after a warm-up."""
    with torch.inference_mode():
        for _ in range(max(10, iterations // 10)):
            module(ids, mask)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iterations):
                module(ids, mask)
    return {event.key: (event.self_cpu_time_total / iterations, event.count / iterations) for event in prof.key_averages()}


def split(ops: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(µs in matrix products and the attention kernel, µs in everything else) per pass."""
    totals: dict[bool, float] = defaultdict(float)
    for name, (micros, _) in ops.items():
        totals[name in MATMUL_OPS] += micros
    return totals[True], totals[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="run directory with a budgeted-hard checkpoint (or its .json)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--top", type=int, default=16, help="operators shown, by dense time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    allocator = keep_freed_memory()  # as the benchmarks time: no pass re-faults its activations' pages

    _, checkpoint = RunDir.locate(args.run_dir, args.seed, command="baa experiment")
    model, description = load_model(checkpoint)
    kept = load_ranking(checkpoint, description, model).kept(args.budget)
    pruned = model.pruned_copy(kept.heads, kept.groups).eval()
    dense_lean, pruned_lean = model.inference_module(), pruned.inference_module()
    vocab = model.input_embedding().num_embeddings
    ids = random_ids(vocab, args.batch_size, args.seq_len, low=model.first_ordinary_id())
    mask = torch.ones_like(ids)
    dense_ops = profile_ops(dense_lean, ids, mask, args.iterations)
    pruned_ops = profile_ops(pruned_lean, ids, mask, args.iterations)

    ideal = model.cost_model(args.seq_len).ideal_speedup(pruned.heads_per_layer, pruned.ffn_widths() if kept.groups is not None else None)
    print(f"{checkpoint}: b = {args.budget}, heads {pruned.heads_per_layer}, FFN neurons {pruned.ffn_widths()}, "
          f"batch {args.batch_size}, seq {args.seq_len}, 1 thread, {type(pruned_lean).__name__}; FLOP-ideal {ideal:.2f}x; {allocator}")
    print(f"{'operator':50s} {'dense µs':>10s} {'calls':>6s} {'pruned µs':>10s} {'calls':>6s} {'dense/pruned':>12s}")
    for name in sorted(dense_ops, key=lambda n: -dense_ops[n][0])[: args.top]:
        (d, dc), (p, pc) = dense_ops[name], pruned_ops.get(name, (0.0, 0.0))
        print(f"{name[:50]:50s} {d:10.1f} {dc:6.0f} {p:10.1f} {pc:6.0f} {(d / p if p else float('inf')):11.2f}x")
    dense_mm, dense_rest = split(dense_ops)
    pruned_mm, pruned_rest = split(pruned_ops)
    print(f"{'matrix products + attention kernel':50s} {dense_mm:10.1f} {'':6s} {pruned_mm:10.1f} {'':6s} {dense_mm / pruned_mm:11.2f}x")
    print(f"{'everything else':50s} {dense_rest:10.1f} {'':6s} {pruned_rest:10.1f} {'':6s} {dense_rest / pruned_rest:11.2f}x")
    total = (dense_mm + dense_rest) / (pruned_mm + pruned_rest)
    print(f"{'total':50s} {dense_mm + dense_rest:10.1f} {'':6s} {pruned_mm + pruned_rest:10.1f} {'':6s} {total:11.2f}x "
          f"({total / ideal:.2f} of FLOP-ideal under the profiler)")


if __name__ == "__main__":
    main()
