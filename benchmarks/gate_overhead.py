"""Latency of the gated module tree vs the family's lean executor (no gate code), same weights.

    python benchmarks/gate_overhead.py runs/d256/checkpoints/seed0/budgeted-hard.json

Times, interleaved (torch.utils.benchmark, 1 thread, median of round medians):
``lean`` (the lean executor at b = 1, the bench's dense reference), ``gated b=1`` (our model at budget 1: gates are exactly 1, the dense
fast path) and ``gated b=0.999`` (gate values computed and multiplied into every head).
"""

from __future__ import annotations

import argparse

import torch

from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.checkpoint import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    model, _ = load_model(args.checkpoint)
    lean = model.eval().inference_module()
    print("| batch | seq | lean ms | gated b=1 ms | overhead | gated b=0.999 ms | overhead |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        ids = torch.randint(0, model.config.vocab_size, (batch, args.seq_len), generator=torch.Generator().manual_seed(0))
        ms = measure_interleaved(
            {"lean": lambda: lean(ids), "b1": lambda: model(ids, budget=1.0), "soft": lambda: model(ids, budget=0.999)},
            threads=1, rounds=args.rounds, min_run_time=0.3,
        )
        print(
            f"| {batch} | {args.seq_len} | {ms['lean']:.3f} | {ms['b1']:.3f} | {100 * (ms['b1'] / ms['lean'] - 1):+.1f}% "
            f"| {ms['soft']:.3f} | {100 * (ms['soft'] / ms['lean'] - 1):+.1f}% |"
        )


if __name__ == "__main__":
    main()
