"""Speed of structurally pruned all-MiniLM-L6-v2 vs our dense path and the unmodified transformers model (SDPA).

    python benchmarks/minilm_speed.py --budgets 0.5 --batch-sizes 1,32 --seq-len 128

Speed depends on how many heads each layer keeps, not on the weights, so this uses a seeded
random head ranking (at least one head per layer); a trained budgeted model's ranking gives
other per-layer counts for the same budget.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_ranking
from budgeted_attention.reporting.bench_table import bench_table
from budgeted_attention.hf.bert import load_gated_bert, minilm_path
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="0.5")
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    model = load_gated_bert(minilm_path(), num_labels=5).eval()
    scores = torch.rand(model.n_layers, model.n_heads, generator=torch.Generator().manual_seed(args.seed))
    ranking = Ranking.from_scores(UnitGates(scores))
    cfg = BenchConfig(
        budgets=[float(b) for b in args.budgets.split(",")],
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        seq_lens=[args.seq_len],
        threads=1,
        rounds=args.rounds,
        min_run_time=0.3,
        include_sliced=False,
    )
    print(bench_table(bench_ranking(model, ranking, cfg, low_id=1000, progress=False)))


if __name__ == "__main__":
    main()
