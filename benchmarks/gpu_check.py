"""GPU smoke check of the family interface: gated, pruned, sorted and sliced forward passes on CUDA
give the CPU logits (our encoder and a tiny BERT), for budgets, explicit gates and empty layers.

    PYTHONPATH=src python benchmarks/gpu_check.py

Part of benchmarks/gpu_check.sh (which also trains and times on the GPU): this checks that nothing in
the forward paths pins tensors to the CPU.
"""

from __future__ import annotations

import sys

import torch

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget, sort_heads
from budgeted_attention.pruning.switching import SlicedModel


def _models():
    torch.manual_seed(0)
    encoder = EncoderClassifier(ModelConfig(vocab_size=50, n_classes=3, max_len=32, d_model=32, n_layers=3, n_heads=4, d_ff=48, pooling="mean"))
    yield "encoder", encoder.eval()
    try:
        from transformers import BertConfig, BertForSequenceClassification

        from budgeted_attention.hf.bert import GatedBertClassifier
    except ImportError as exc:  # pragma: no cover
        print(f"skip bert: {exc}")
        return
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37, num_labels=3)
    cfg._attn_implementation = "sdpa"
    yield "bert", GatedBertClassifier(BertForSequenceClassification(cfg)).eval()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    ids = torch.randint(1, 50, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    failures = 0
    for name, model in _models():
        with torch.no_grad():
            model.gates.bias.copy_(torch.randn(3, 4, generator=torch.Generator().manual_seed(2)))
        ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(3))), min_one_per_layer=False)
        variants = {
            "full": model,
            "pruned": prune_to_budget(model, ranking, 0.4),
            "sorted": sort_heads(model, ranking),
            "empty-layer": model.pruned_copy([[2, 0], [], [3]]),
        }
        sliced = SlicedModel(model, ranking)
        sliced.set_budget(0.5)
        variants["sliced"] = sliced
        for variant, module in variants.items():
            for kwargs in ({}, {"budget": 0.3}, {"budget": 1.0}):
                with torch.no_grad():
                    expected = module(ids, mask, **kwargs)
                    module_gpu = module.to("cuda")
                    got = module_gpu(ids.cuda(), mask.cuda(), **kwargs).cpu()
                    module.to("cpu")
                diff = float((got - expected).abs().max())
                ok = diff < 1e-4
                failures += not ok
                print(f"{name:8s} {variant:12s} {str(kwargs):16s} max|gpu-cpu| = {diff:.2e} {'ok' if ok else 'FAIL'}")
            if variant == "full":
                with torch.no_grad():
                    gates = ranking.masks(0.5).heads.cuda()
                    got = module.to("cuda")(ids.cuda(), mask.cuda(), gates=gates).cpu()
                    module.to("cpu")
                    expected = module(ids, mask, gates=ranking.masks(0.5).heads)
                diff = float((got - expected).abs().max())
                failures += diff >= 1e-4
                print(f"{name:8s} {'full':12s} {'gates=mask':16s} max|gpu-cpu| = {diff:.2e} {'ok' if diff < 1e-4 else 'FAIL'}")
    print(f"{failures} failure(s) on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
