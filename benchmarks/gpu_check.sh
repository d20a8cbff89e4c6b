#!/usr/bin/env bash
# GPU figures for docs/results.md, for a maintainer with a CUDA GPU (under 5 minutes on one GPU).
#
#   bash benchmarks/gpu_check.sh            # after `make install` (or with the package installed)
#
# 1. forward equality GPU vs CPU for every model family and layout (benchmarks/gpu_check.py);
# 2. the d256 whole-model-budget model trained on the GPU with short schedules (speed does not
#    depend on how well it is trained), the test suite's GPU tests;
# 3. if 2+ GPUs: the same training under torchrun (DDP, nccl);
# 4. baa bench --device cuda at batch 1 and 64: eager, torch.compile, CUDA graphs
#    (runs/gpu_d256_all/bench_cuda*.json; `baa report runs/gpu_d256_all ...` renders them).
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/gpu_d256_all}
SHORT=(--set train.dense_steps=200 --set train.budgeted_steps=150 --set train.hard_steps=50)

"$BIN/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: nothing to check')"
"$BIN/python" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| GPUs:', torch.cuda.device_count())"
"$BIN/python" benchmarks/gpu_check.py
"$BIN/python" -m pytest -q tests/benchmark/test_bench_config.py tests/training/test_distributed.py
"$BIN/baa" demo --no-progress --device cuda --config configs/d256_all.yaml --out "$OUT" "${SHORT[@]}"
if [ "$("$BIN/python" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  "$BIN/torchrun" --standalone --nproc-per-node 2 -m budgeted_attention.cli demo --no-progress --device cuda \
    --config configs/d256_all.yaml --out "$OUT-ddp" "${SHORT[@]}"
fi
COMMON=(--budgets 0.25,0.5,0.75 --batch-sizes 1,64 --seq-lens 128 --rounds 5 --no-progress)
"$BIN/baa" bench "$OUT" --device cuda "${COMMON[@]}" --json "$OUT/bench_cuda.json"
"$BIN/baa" bench "$OUT" --device cuda --compile "${COMMON[@]}" --json "$OUT/bench_cuda_compiled.json"
"$BIN/baa" bench "$OUT" --device cuda --cuda-graphs "${COMMON[@]}" --json "$OUT/bench_cuda_graphs.json"
echo "GPU figures in $OUT/bench_cuda*.md; add '$OUT' to the baa report command (Makefile target 'results')."
