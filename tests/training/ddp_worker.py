"""Run by tests/training/test_distributed.py, alone or under torchrun (not collected by pytest).

    python ddp_worker.py steps OUT          # 20 optimiser steps (10 dense + 10 budgeted) of a tiny encoder
    python ddp_worker.py experiment CONFIG OUT   # a tiny baa experiment
    python ddp_worker.py fail OUT           # rank 1 raises while rank 0 waits

``steps``: rank 0 saves the trained weights to OUT/weights.safetensors. Every rank records the
files it renamed into place (``os.replace``) in OUT/replaced-rank<R>.json (written directly, as
instrumentation), so the test can check that non-zero ranks wrote nothing.
"""

import json
import os
import sys
from pathlib import Path

import torch

REPLACED: list[str] = []
_replace = os.replace


def _recording_replace(src, dst, *args, **kwargs):
    REPLACED.append(str(dst))
    return _replace(src, dst, *args, **kwargs)


os.replace = _recording_replace


def steps(out: Path) -> None:
    from safetensors.torch import save_file

    from budgeted_attention.data.dataset import Split
    from budgeted_attention.model.config import ModelConfig
    from budgeted_attention.model.transformer import EncoderClassifier
    from budgeted_attention.training import distributed
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_budgeted, train_dense

    with distributed.running("cpu"):
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 40, (45, 10), generator=generator)  # 45 rows: the last batch of 5 splits 3 + 2
        mask = torch.ones_like(ids)
        mask[::3, 7:] = 0
        train = Split(ids, mask, torch.randint(0, 3, (45,), generator=generator))
        torch.manual_seed(0)
        model = EncoderClassifier(ModelConfig(vocab_size=40, n_classes=3, max_len=10, d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.0))
        cfg = TrainConfig(batch_size=8, dense_steps=10, budgeted_steps=10, distill_weight=0.5)
        train_dense(model, train, cfg, seed=0, progress=False)
        teacher = EncoderClassifier(model.config)
        teacher.load_state_dict(model.state_dict())
        costs = model.unit_costs(10)
        train_budgeted(model, train, cfg, costs, seed=0, teacher=teacher, progress=False)
        if distributed.current().is_main:
            with torch.no_grad():
                logits = model(ids, mask, budget=0.5)
            tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
            save_file({**tensors, "logits_at_b0.5": logits.contiguous()}, str(out / "weights.safetensors"))


def fail(out: Path) -> None:
    """Rank 1 fails at once while rank 0 waits in a barrier: the job must end, not hang."""
    from budgeted_attention.training import distributed

    with distributed.running("cpu") as runtime:
        if runtime.rank == 1:
            raise ValueError("rank 1 failed on purpose")
        distributed.barrier()


TIMED: list[str] = []  # timing calls of this rank, by kind


def experiment(config: str, out: Path) -> None:
    from budgeted_attention.benchmark import runner
    from budgeted_attention.pipeline import run_experiment
    from budgeted_attention.pipeline.methods import hard, ladder, static

    for module in (runner, hard, ladder, static):  # count every timing call, wherever it is imported from
        for name in ("bench_models", "bench_against_reference", "bench_ranking"):
            original = getattr(module, name, None)
            if original is not None and not hasattr(original, "counted"):

                def counted(*args, _original=original, _name=name, **kwargs):
                    TIMED.append(_name)
                    return _original(*args, **kwargs)

                counted.counted = True
                setattr(module, name, counted)
    run_experiment(config, str(out / "run"), progress=False)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    out = Path(rest[-1])
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    if mode == "steps":
        steps(out)
    elif mode == "fail":
        fail(out)
    else:
        experiment(rest[0], out)
    with open(out / f"replaced-rank{rank}.json", "w", encoding="utf-8") as handle:  # instrumentation, not a run file
        json.dump([p for p in REPLACED if not p.endswith("weights.safetensors")], handle)
    with open(out / f"timed-rank{rank}.json", "w", encoding="utf-8") as handle:
        json.dump(TIMED, handle)
