"""Per-input routing through the lean copy: equal logits to the routed model's own forward for
every head set the router picks (both families), the module tree for anything but one input in
eval mode without autograd, and a rebuild when the model changed."""

import pytest
import torch

from budgeted_attention.model.compact import CompactEncoder
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.model.routed_inference import RoutedInference
from budgeted_attention.model.transformer import EncoderClassifier

from conftest import tiny_config


def _routed(mode: str = "capped", **overrides) -> EncoderClassifier:
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(**overrides))
    router = model.attach_router(RouterConfig(mode=mode))
    with torch.no_grad():  # distinct scores and fractions per input; non-zero output biases
        router.scorer.weight.normal_(std=2.0)
        router.controller[2].weight.normal_(std=2.0)
        for block in model.blocks:
            block.attn.out_bias.normal_(std=0.1)
    return model.eval()


def _inputs(batch: int = 8, seq: int = 11):
    ids = torch.randint(0, 29, (batch, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    if batch > 3:
        mask[3, 2:] = 0
    return ids, mask


def _per_input(runtime, model, ids, mask, budget):
    """(lean, module tree) logits of each input alone, and the distinct head sets seen."""
    lean, tree, sets = [], [], set()
    with torch.no_grad():
        for i in range(ids.shape[0]):
            one, one_mask = ids[i : i + 1], mask[i : i + 1]
            lean.append(runtime(one, one_mask, budget=budget))
            tree.append(model(one, one_mask, budget=budget))
            positions = runtime.head_sets(one, one_mask, budget=budget)
            sets.add(None if positions is None else tuple(positions))
    return torch.cat(lean), torch.cat(tree), sets


@pytest.mark.parametrize("budget", [0.25, 0.5, 1.0])
def test_lean_routed_logits_equal_the_routed_model(budget):
    model = _routed()
    runtime = RoutedInference(model)
    assert isinstance(runtime.lean, CompactEncoder)
    ids, mask = _inputs()
    lean, tree, sets = _per_input(runtime, model, ids, mask, budget)
    assert torch.allclose(lean, tree, atol=1e-5)
    misses = sum(layer._gathered.misses for layer in runtime.lean.layers)
    if budget < 1.0:
        assert len(sets) > 1  # inputs ran different head sets
        assert any(0 < len(s) < model.n_heads for layer_sets in sets for s in layer_sets)  # sets of some heads ran
        gapped = any(s[-1] - s[0] + 1 != len(s) for layer_sets in sets for s in layer_sets)
        assert gapped or budget == 0.25  # at b = 0.5 some set has a gap (gathered); adjacent heads run from views
        assert (misses > 0) == gapped
    else:
        assert misses == 0


def test_learned_router():
    model = _routed("learned")
    runtime = RoutedInference(model)
    ids, mask = _inputs()
    lean, tree, _ = _per_input(runtime, model, ids, mask, None)
    assert torch.allclose(lean, tree, atol=1e-5)


def test_a_wrong_gather_changes_the_logits():
    """Negative control: running each set's complement must not match."""
    model = _routed()
    runtime = RoutedInference(model)
    ids, mask = _inputs(batch=1)
    with torch.no_grad():
        positions = runtime.head_sets(ids, None, budget=0.25)
        wrong = [tuple(h for h in range(model.n_heads) if h not in heads) or heads for heads in positions]
        assert not torch.allclose(runtime.lean(ids, mask, head_sets=wrong), model(ids, mask, budget=0.25), atol=1e-4)


def test_batches_training_and_autograd_run_the_module_tree():
    model = _routed()
    runtime = RoutedInference(model)
    ids, mask = _inputs(batch=3)
    with torch.no_grad():
        assert torch.allclose(runtime(ids, mask, budget=0.5), model(ids, mask, budget=0.5), atol=1e-6)
        assert runtime.lean.layers[0]._gathered.misses == 0  # the batch never reached the copy
    with torch.enable_grad():
        assert runtime(ids[:1], mask[:1], budget=0.5).requires_grad
    model.train()
    assert runtime.current_lean() is None
    model.eval()
    with torch.no_grad():
        assert runtime.current_lean() is runtime.lean


def test_the_copy_is_rebuilt_after_a_weight_change():
    model = _routed()
    runtime = RoutedInference(model)
    ids, mask = _inputs(batch=1)
    with torch.no_grad():
        before = runtime.lean
        runtime(ids, mask, budget=0.5)
        model.blocks[0].attn.qkv_weight.mul_(1.5)  # in place: the cached gathers are stale
        after = runtime(ids, mask, budget=0.5)
        assert runtime.lean is not before
        assert torch.allclose(after, model(ids, mask, budget=0.5), atol=1e-5)


def test_needs_a_router_runs_qk_norm_lean_and_the_module_tree_where_the_model_says_so():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="router"):
        RoutedInference(EncoderClassifier(tiny_config()))
    ids, mask = _inputs(batch=1)
    model = _routed(qk_norm=True, residual_gate=True)  # the lean executor runs QK-norm and residual gains
    runtime = RoutedInference(model)
    with torch.no_grad():
        assert isinstance(runtime.current_lean(), CompactEncoder)
        assert torch.allclose(runtime(ids, mask, budget=0.5), model(ids, mask, budget=0.5), atol=1e-5)
    with torch.inference_mode():  # no version counters: the model says it has no executor, the module tree serves
        frozen = _routed()
    assert "inference tensors" in frozen.lean_unsupported(routed=True)
    runtime = RoutedInference(frozen)
    assert runtime.lean is None
    with torch.no_grad():
        assert torch.allclose(runtime(ids, mask, budget=0.5), frozen(ids, mask, budget=0.5))


def test_ffn_widths_set_on_the_model_reach_the_copy():
    model = _routed(ffn_group_size=12)
    runtime = RoutedInference(model)
    ids, mask = _inputs(batch=1)
    with torch.no_grad():
        runtime(ids, mask, budget=0.5)
        model.set_active(model.heads_per_layer, [1] * model.n_layers)  # narrower FFNs, every head
        for budget in (0.5, 1.0):
            assert torch.allclose(runtime(ids, mask, budget=budget), model(ids, mask, budget=budget), atol=1e-5)
        assert [layer.ffn_width for layer in runtime.lean.layers] == model.active_ffn_widths()


def test_training_steps_of_the_trainer_reach_the_copy():
    """The trainer's fused AdamW writes weights without bumping their versions; it bumps them."""
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_dense

    from budgeted_attention.data.dataset import Split

    model = _routed("learned")
    runtime = RoutedInference(model)
    ids, mask = _inputs(batch=1)
    with torch.no_grad():
        runtime(ids, mask)  # a cached head set and a built copy
    before = runtime.lean
    train_ids, train_mask = _inputs()
    train = Split(train_ids, train_mask, torch.arange(train_ids.shape[0]) % model.config.n_classes)
    train_dense(model, train, TrainConfig(dense_steps=2, batch_size=4, lr=0.05), seed=0, progress=False)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(runtime(ids, mask), model(ids, mask), atol=1e-5)
    assert runtime.lean is not before


def test_runtime_train_then_model_eval_still_serves_through_the_copy():
    model = _routed()
    runtime = RoutedInference(model)
    runtime.train()  # reaches the model; the copy is not a child module and stays in eval mode
    model.eval()
    ids, mask = _inputs(batch=1)
    with torch.no_grad():
        assert runtime.current_lean() is runtime.lean and not runtime.lean.training
        assert torch.allclose(runtime(ids, mask, budget=0.5), model(ids, mask, budget=0.5), atol=1e-5)


@pytest.mark.parametrize("family", ["encoder", "bert"])
def test_sets_with_gaps_run_run_by_run_once_the_cache_is_full(family):
    """No room in the cache: gapped sets run per run of adjacent heads from views, same logits."""
    from budgeted_attention.model.heads import _runs

    assert _runs((0, 1, 3, 5, 6, 7)) == [(0, 2), (3, 4), (5, 8)] and _runs((2,)) == [(2, 3)]
    if family == "bert":
        pytest.importorskip("transformers")
        from transformers import BertConfig, BertForSequenceClassification

        from budgeted_attention.hf.bert import GatedBertClassifier

        torch.manual_seed(0)
        config = BertConfig(vocab_size=29, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, intermediate_size=16, num_labels=3,
                            attn_implementation="sdpa", initializer_range=0.2)
        model = GatedBertClassifier(BertForSequenceClassification(config).eval())
        router = model.attach_router(RouterConfig(mode="capped"))
        with torch.no_grad():
            router.scorer.weight.normal_(std=2.0)
            router.controller[2].weight.normal_(std=2.0)
        model.eval()
    else:
        model = _routed(n_heads=8, d_model=32)
    runtime = RoutedInference(model)
    for layer in runtime.lean.layers:
        layer._gathered.max_bytes = 0
    ids, mask = _inputs()
    lean, tree, sets = _per_input(runtime, model, ids, mask, 0.5)
    assert torch.allclose(lean, tree, atol=1e-5)
    assert any(len(_runs(s)) > 1 for layer_sets in sets for s in layer_sets)  # gapped sets ran, run by run
    assert all(len(layer._gathered) == 0 for layer in runtime.lean.layers)  # nothing was copied into the cache


def test_head_sets_decided_ahead_run_as_the_forward_pass():
    """Deciding first and running later (the routed bench's preset run) is the forward pass."""
    model = _routed()
    runtime = RoutedInference(model)
    ids, mask = _inputs()
    with torch.no_grad():
        for i in range(ids.shape[0]):
            one, one_mask = ids[i : i + 1], mask[i : i + 1]
            sets = runtime.head_sets(one, one_mask, budget=0.5)
            assert len(sets) == model.n_layers and all(list(s) == sorted(s) for s in sets)
            assert torch.equal(runtime.lean(one, one_mask, head_sets=sets), runtime(one, one_mask, budget=0.5))
        assert runtime.head_sets(ids[:1], mask[:1], budget=1.0) is None  # a capped router at b = 1: every head
        with pytest.raises(ValueError, match="one input, got a batch of 8"):
            runtime.head_sets(ids, mask, budget=0.5)
        model.router.train()
        with pytest.raises(ValueError, match="eval mode"):
            runtime.head_sets(ids[:1], mask[:1], budget=0.5)
