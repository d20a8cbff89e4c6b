"""The hf-decoder family: transformers causal LMs (Llama, Qwen2, Qwen3, Gemma 3 text) with budget gates.

Tiny random configs of each layout: logits equal transformers' at b = 1, the GatedModel interface
(soft and bad budgets, hard selection = pruned = sliced, save/load), K/V-group surgery, sliding
windows after pruning, loading from a folder and a GGUF file, one-line refusals, and the training
stages through the LM task.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from budgeted_attention import checkpoint  # noqa: E402
from budgeted_attention.errors import BAAError, CheckpointError  # noqa: E402
from budgeted_attention.hf.decoder import GatedDecoderLM, load_hf_decoder, unmodified_reference  # noqa: E402
from budgeted_attention.hf.decoder_layouts import UnsupportedLayoutError, check_tokenizer, layout_of, split_gguf_path  # noqa: E402
from budgeted_attention.model.gates import UnitGates  # noqa: E402
from budgeted_attention.pruning.selection import Ranking  # noqa: E402
from budgeted_attention.pruning.surgery import prune_to_budget, sort_heads  # noqa: E402
from budgeted_attention.pruning.switching import SlicedModel  # noqa: E402

VOCAB, SEQ = 97, 11
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
    intermediate_size=48, max_position_embeddings=64, attn_implementation="sdpa",
)
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def tiny_config(layout: str, **overrides):
    settings = dict(COMMON, **overrides)
    if layout == "llama":
        return transformers.LlamaConfig(**settings)
    if layout == "qwen2":  # Qwen2 with its sliding window on the upper layers, biased Q/K/V
        return transformers.Qwen2Config(**{"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, **settings})
    if layout == "qwen3":
        return transformers.Qwen3Config(**{"head_dim": 8, **settings})
    return transformers.Gemma3TextConfig(**{
        "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 12, "final_logit_softcapping": 5.0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], **settings,
    })


def tiny_hf(layout: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    hf = getattr(transformers, CLASSES[layout])(tiny_config(layout, **overrides)).eval()
    with torch.no_grad():  # non-trivial norms and biases (Gemma's norms start at 0, i.e. 1 + 0)
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf


def tiny_model(layout: str, group_size: int = 8, **overrides) -> GatedDecoderLM:
    model = GatedDecoderLM(tiny_hf(layout, **overrides), ffn_group_size=group_size)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.gates.bias.copy_(torch.randn(model.gates.bias.shape, generator=gen))
        model.gates.slope_raw.copy_(torch.randn(model.gates.slope_raw.shape, generator=gen))
        if model.ffn_gates is not None:
            model.ffn_gates.bias.copy_(torch.randn(model.ffn_gates.bias.shape, generator=gen))
    return model.eval()


def ids_and_mask(batch: int = 3, seq: int = SEQ):
    ids = torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, seq - 4:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    return ids, mask


LAYOUTS = list(CLASSES)


# ---------------------------------------------------------------------- equality with transformers


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_equal_the_transformers_model_at_full_budget(layout):
    hf = tiny_hf(layout)
    ids, mask = ids_and_mask()
    with torch.no_grad():
        reference = hf(input_ids=ids).logits
        reference_masked = hf(input_ids=ids, attention_mask=mask).logits
    model = GatedDecoderLM(hf, ffn_group_size=8).eval()
    with torch.no_grad():
        logits = model(ids)
        masked = model(ids, mask)
        torch.testing.assert_close(model(ids, budget=1.0), logits)
    assert logits.shape == (3, SEQ, VOCAB)
    diff = float((logits - reference).abs().max())
    diff_masked = float((masked - reference_masked)[mask.bool()].abs().max())  # padded positions' logits are meaningless
    print(f"{layout}: max |logit diff| vs transformers {diff:.2e}, padded batch {diff_masked:.2e}")
    assert diff < 1e-5 and diff_masked < 1e-5
    assert torch.isfinite(masked).all()  # a left-padded query sees itself: no NaN


def test_the_sliding_window_is_used_and_matters():
    """Gemma's window (4) is shorter than the sequence: removing it changes the logits, so the
    equality above really covers the windowed mask."""
    model = tiny_model("gemma3_text")
    assert [a.sliding_window for a in model.attentions] == [4, None, 4]
    ids, _ = ids_and_mask()
    with torch.no_grad():
        windowed = model(ids)
        for attention in model.attentions:
            attention.sliding_window = None
        assert not torch.allclose(model(ids), windowed)


def test_library_reference_is_an_independent_transformers_copy():
    model = tiny_model("gemma3_text")
    ids, mask = ids_and_mask()
    reference = model.library_references()["transformers"]
    with torch.no_grad():
        torch.testing.assert_close(reference(ids)[..., :], model(ids), atol=1e-5, rtol=1e-5)
        model.hf.model.norm.weight.add_(1.0)  # the reference holds its own weights
        assert not torch.allclose(reference(ids), model(ids))
    pruned = model.pruned_copy([[0, 1]] * 3)
    assert pruned.library_references() == {}
    with pytest.raises(ValueError, match="pruned"):
        unmodified_reference(pruned)


# ---------------------------------------------------------------------- the GatedModel interface


@pytest.mark.parametrize("layout", LAYOUTS)
def test_soft_budget_and_bad_budget(layout):
    model = tiny_model(layout)
    ids, mask = ids_and_mask()
    with torch.no_grad():
        dense = model(ids, mask)
        assert not torch.allclose(model(ids, mask, budget=0.3), dense)
        gates = model.unit_gates(0.3)
        torch.testing.assert_close(model(ids, mask, gates=gates), model(ids, mask, budget=0.3))
        per_input = model.gates(0.5).expand(3, -1, -1)  # per-input head gates (batch, layers, heads)
        torch.testing.assert_close(model(ids, mask, gates=per_input), model(ids, mask, gates=UnitGates(model.gates(0.5))))
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(BAAError, match="budget"):
            model(ids, budget=bad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_hard_selection_prune_and_switch_agree(layout):
    model = tiny_model(layout)
    ids, mask = ids_and_mask()
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    sliced = SlicedModel(sort_heads(copy.deepcopy(model), ranking), ranking)
    with torch.no_grad():
        for budget in (0.2, 0.5, 0.8, 1.0):
            masked = model(ids, mask, gates=ranking.masks(budget))
            pruned = prune_to_budget(copy.deepcopy(model), ranking, budget)
            assert pruned.is_pruned == (budget < 1.0)
            real = mask.bool()
            torch.testing.assert_close(pruned(ids, mask)[real], masked[real], atol=1e-5, rtol=1e-5)
            sliced.set_budget(budget)
            torch.testing.assert_close(sliced(ids, mask)[real], masked[real], atol=1e-5, rtol=1e-5)
            # budget gates keep their meaning on the pruned layout
            torch.testing.assert_close(pruned(ids, mask, budget=0.4)[real], model(ids, mask, gates=_and(model.unit_gates(0.4), ranking.masks(budget)))[real], atol=1e-5, rtol=1e-5)


def _and(gates: UnitGates, mask: UnitGates) -> UnitGates:
    return UnitGates(gates.heads * mask.heads, None if gates.ffn is None else gates.ffn * mask.ffn)


def test_routing_is_refused_by_name_and_first_ordinary_id():
    model = tiny_model("llama")
    with pytest.raises(BAAError, match="the hf-decoder family's lean executor does not run per-input routing"):
        model.inference_module(routed=True)
    assert model.lean_unsupported() is None and model.lean_unsupported(routed=True) == "per-input routing"
    assert 0 <= model.pad_id < model.vocab_size == VOCAB
    assert model.first_ordinary_id() > model.pad_id
    with pytest.raises(ValueError, match="no per-input head routing"):
        model.attach_router(None)


# ---------------------------------------------------------------------- lean executor: K/V cache, decoding


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_decoding_equals_the_full_forward_pass_on_a_pruned_model(layout):
    """Prefill in two chunks, then one token at a time, with left and right padding and sliding
    windows (4) shorter than the sequence: every position's logits equal the module tree's."""
    model = tiny_model(layout)
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.5)
    seq = 14
    ids, mask = ids_and_mask(seq=seq)
    runner = pruned.inference_module()
    with torch.no_grad():
        full = pruned(ids, mask)
        torch.testing.assert_close(runner(ids, mask), full, atol=1e-5, rtol=1e-5)
        cache = runner.new_cache()
        pieces = [runner.step(ids[:, :5], cache, mask[:, :5]), runner.step(ids[:, 5:9], cache, mask[:, 5:9])]
        pieces += [runner.step(ids[:, t : t + 1], cache, mask[:, t : t + 1]) for t in range(9, seq)]
    real = mask.bool()
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], full[real], atol=1e-5, rtol=1e-5)
    assert cache.length == seq
    for attention, keys in zip(pruned.attentions, cache.keys):  # each layer caches its surviving K/V heads only
        window = attention.sliding_window
        assert keys.shape == (3, attention.num_kv_heads, seq if window is None else window - 1, attention.head_dim)


def test_removing_a_kv_group_shrinks_the_cache_and_greedy_generation_matches_the_forward_pass():
    """Issue item 4 on the cache: 8 query heads in 2 K/V groups; layer 0 keeps group 0 only."""
    model = tiny_model("llama")
    kept = [[0, 2, 3, 1], [5, 0], [1, 2, 3, 4, 5, 6, 7, 0]]
    pruned = model.pruned_copy(kept)
    ids = ids_and_mask()[0][:2]
    dense_cache, cache = model.inference_module().new_cache(), pruned.inference_module().new_cache()
    with torch.no_grad():
        model.inference_module().step(ids, dense_cache)
        pruned.inference_module().step(ids, cache)
    assert [k.shape[1] for k in cache.keys] == [1, 2, 2] and cache.nbytes() == dense_cache.nbytes() * 5 // 6
    out = pruned.inference_module().generate(ids, 6)
    assert out.shape == (2, SEQ + 6) and torch.equal(out[:, :SEQ], ids)
    with torch.no_grad():  # each generated token is the argmax of the full forward pass over what precedes it
        torch.testing.assert_close(pruned(out[:, :-1])[:, SEQ - 1 :].argmax(-1), out[:, SEQ:])
    with pytest.raises(BAAError, match="exceed the model's 64 positions"):
        pruned.inference_module().generate(ids, 60)
    with pytest.raises(BAAError, match="max_new_tokens must be >= 1"):
        pruned.inference_module().generate(ids, 0)


# ---------------------------------------------------------------------- surgery: K/V groups, windows


def test_removing_a_whole_kv_group_shrinks_the_kv_projection_and_keeps_the_logits():
    """Issue item 4: 8 query heads in 2 K/V groups (4 each); layer 0 keeps group 0 only, layer 1
    keeps one head of each group, layer 2 nothing."""
    model = tiny_model("llama", num_hidden_layers=3)
    ids, mask = ids_and_mask()
    kept = [[0, 2, 3, 1], [5, 0], []]
    masks = torch.zeros(3, 8)
    for layer, heads in enumerate(kept):
        masks[layer, heads] = 1.0
    pruned = model.pruned_copy(kept)
    hd = model.attentions[0].head_dim
    assert pruned.heads_per_layer == [4, 2, 0]
    assert pruned.kv_heads_per_layer() == [1, 2, 0]
    first = pruned.attentions[0]
    assert first.k_proj.weight.shape == (hd, 32) and first.v_proj.weight.shape == (hd, 32)
    assert first.q_proj.weight.shape == (4 * hd, 32) and first.o_proj.weight.shape == (32, 4 * hd)
    assert pruned.attentions[2].k_proj.weight.shape == (0, 32)
    with torch.no_grad():
        real = mask.bool()
        torch.testing.assert_close(pruned(ids, mask)[real], model(ids, mask, gates=masks)[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pruned(ids), model(ids, gates=masks), atol=1e-5, rtol=1e-5)
    # a group leaves only with its last query head: group 1 of layer 1 still has head 5
    assert pruned.attentions[1].kv_ids == [0, 1] and pruned.attentions[1].q_group == [1, 0]
    # the cost model counts a K/V group's projections exactly when the whole group leaves
    cost = model.cost_model(SEQ)
    per_head_kv = 2 * 2 * SEQ * 32 * hd * (2 / 8)
    assert cost.head_flops(0) == 2 * 2 * SEQ * 32 * hd + per_head_kv + 2 * 2 * (SEQ * (SEQ + 1) // 2) * hd


def test_surgery_on_a_sorted_model_with_heads_out_of_group_order():
    model = tiny_model("qwen3")
    ids, mask = ids_and_mask()
    order = [[7, 0, 6, 1, 5, 2, 4, 3], [4, 5, 6, 7, 0, 1, 2, 3], list(range(8))]
    sorted_model = model.pruned_copy(order)
    with torch.no_grad():
        torch.testing.assert_close(sorted_model(ids), model(ids), atol=1e-5, rtol=1e-5)
    again = sorted_model.pruned_copy([[7, 6, 5, 4], [0, 2], [3]])
    assert again.kv_heads_per_layer() == [1, 1, 1]
    masks = torch.zeros(3, 8)
    for layer, heads in enumerate([[7, 6, 5, 4], [0, 2], [3]]):
        masks[layer, heads] = 1.0
    with torch.no_grad():
        torch.testing.assert_close(again(ids), model(ids, gates=masks), atol=1e-5, rtol=1e-5)


def test_sliding_window_layers_keep_their_windows_after_pruning():
    model = tiny_model("gemma3_text")
    ids, mask = ids_and_mask(seq=13)  # longer than the window (4)
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(13))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.5)
    assert [a.sliding_window for a in pruned.attentions] == [4, None, 4]
    assert [a.layer_type for a in pruned.attentions] == ["sliding_attention", "full_attention", "sliding_attention"]
    with torch.no_grad():
        real = mask.bool()
        torch.testing.assert_close(pruned(ids, mask)[real], model(ids, mask, gates=ranking.masks(0.5))[real], atol=1e-5, rtol=1e-5)
    cost = model.cost_model(13)
    assert cost.attention_pairs(0) == 4 * 5 // 2 + (13 - 4) * 4 < cost.attention_pairs(1) == 13 * 14 // 2


def test_ffn_group_surgery_and_neuron_sorting():
    model = tiny_model("qwen2")
    ids, _ = ids_and_mask()
    orders = [torch.randperm(48, generator=torch.Generator().manual_seed(layer)).tolist() for layer in range(3)]
    sorted_model = copy.deepcopy(model)
    sorted_model.sort_ffn_neurons(orders)
    with torch.no_grad():
        torch.testing.assert_close(sorted_model(ids), model(ids), atol=1e-5, rtol=1e-5)
    full = [list(range(8))] * 3
    pruned = model.pruned_copy(full, [[0, 2], [5], []])
    assert pruned.ffn_widths() == [16, 8, 0]
    assert pruned.mlps[0].gate_proj.weight.shape == (16, 32) and pruned.mlps[0].down_proj.weight.shape == (32, 16)
    ffn = torch.zeros(3, 6)
    ffn[0, [0, 2]] = ffn[1, 5] = 1.0
    with torch.no_grad():
        torch.testing.assert_close(pruned(ids), model(ids, gates=UnitGates(torch.ones(3, 8), ffn)), atol=1e-5, rtol=1e-5)


def test_unit_costs_cover_the_prunable_flops_and_report_the_output_layer():
    model = tiny_model("gemma3_text")
    cost = model.cost_model(SEQ)
    units = model.unit_costs(SEQ)
    assert units.heads.shape == (3, 8) and units.ffn.shape == (3, 6)
    prunable = float(units.heads.sum() + units.ffn.sum())
    assert prunable + cost.classifier_flops() == pytest.approx(cost.total_flops())
    assert 0 < cost.fixed_fraction() < 1
    assert cost.ideal_speedup([4, 4, 4], [24, 24, 24]) > 1.0


# ---------------------------------------------------------------------- save / load


@pytest.mark.parametrize("layout", ["llama", "gemma3_text"])
def test_save_load_round_trip_of_a_pruned_model_is_bit_exact(layout, tmp_path):
    model = tiny_model(layout)
    ids, mask = ids_and_mask()
    pruned = model.pruned_copy([[0, 1, 2, 3], [6, 1], []], [[0, 1, 2], [5], [0, 1, 2, 3, 4, 5]])
    assert pruned.kv_heads_per_layer() == [1, 2, 0]
    path = checkpoint.save_model(pruned, tmp_path / "m.safetensors")
    description = checkpoint.read_description(path)
    assert description["family"] == "hf-decoder" and description["architecture"]["kv_heads"] == [1, 2, 0]
    loaded, _ = checkpoint.load_model(path)
    assert loaded.heads_per_layer == pruned.heads_per_layer and loaded.kv_heads_per_layer() == [1, 2, 0]
    assert loaded.groups_per_layer == pruned.groups_per_layer
    for (name, a), (_, b) in zip(pruned.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.tied_output == pruned.tied_output
    with torch.no_grad():
        assert torch.equal(loaded(ids, mask), pruned(ids, mask))
        assert torch.equal(loaded(ids, budget=0.4), pruned(ids, budget=0.4))


# ---------------------------------------------------------------------- loading and refusals


def test_load_from_a_local_folder_written_by_save_pretrained(tmp_path):
    hf = tiny_hf("qwen3")
    hf.save_pretrained(tmp_path / "qwen3")
    model = load_hf_decoder(tmp_path / "qwen3", ffn_group_size=8)
    ids, mask = ids_and_mask()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert model.has_ffn_units


def test_a_folder_with_missing_weights_is_refused_naming_them(tmp_path):
    hf = tiny_hf("llama")
    state = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    hf.save_pretrained(tmp_path / "m", state_dict=state)
    with pytest.raises(CheckpointError, match="missing .*layers.1.mlp.up_proj") as info:
        load_hf_decoder(tmp_path / "m")
    assert "\n" not in str(info.value)


def write_tiny_gguf(folder, hf) -> str:
    """A float32 Llama GGUF of ``hf`` (llama.cpp's Q/K row order), as llama.cpp's converter writes it."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    cfg = hf.config
    folder.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(folder / "tiny.gguf"), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    for key, value in hf.state_dict().items():
        array = value.detach().numpy().astype(np.float32)
        if key.endswith("q_proj.weight"):
            array = permute(array, cfg.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            array = permute(array, cfg.num_key_value_heads)
        writer.add_tensor(names.get_name(key.removesuffix(".weight")) + ".weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return "tiny.gguf"


def test_load_from_a_gguf_file_and_refuse_a_truncated_or_missing_one(tmp_path):
    hf = tiny_hf("llama", num_hidden_layers=2)
    name = write_tiny_gguf(tmp_path / "gguf", hf)
    model = load_hf_decoder(tmp_path / "gguf", gguf_file=name)
    ids, _ = ids_and_mask()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    data = (tmp_path / "gguf" / name).read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / name).write_bytes(data[: len(data) * 2 // 3])  # a truncated copy
    with pytest.raises(CheckpointError, match="not a readable GGUF file") as info:
        load_hf_decoder(cut, gguf_file=name)
    assert "\n" not in str(info.value)
    (cut / "header.gguf").write_bytes(data[:40])  # cut inside the header
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        load_hf_decoder(cut, gguf_file="header.gguf")
    with pytest.raises(CheckpointError, match="GGUF file not found"):
        load_hf_decoder(cut, gguf_file="absent.gguf")
    assert split_gguf_path(cut / name) == (str(cut), name)
    assert split_gguf_path("Qwen/Qwen3-0.6B") == ("Qwen/Qwen3-0.6B", None)


def test_unsupported_layouts_are_refused_in_one_line_naming_what_is_missing(tmp_path):
    gpt2 = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50)
    with pytest.raises(UnsupportedLayoutError, match=r"'gpt2' is not a supported decoder layout: it lacks grouped K/V heads") as info:
        layout_of(gpt2)
    assert "rms_norm_eps" in str(info.value) and "rope_parameters" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UnsupportedLayoutError, match="'gpt2'"):
        GatedDecoderLM(transformers.GPT2LMHeadModel(gpt2))
    bert = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    with pytest.raises(UnsupportedLayoutError, match="'bert' .*causal self-attention .*RMSNorm"):
        layout_of(bert)
    gpt2_folder = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(gpt2_folder)
    with pytest.raises(UnsupportedLayoutError, match="'gpt2'"):
        load_hf_decoder(gpt2_folder)
    with pytest.raises(CheckpointError, match="config.json' not found"):
        load_hf_decoder(tmp_path / "nowhere")
    capped = tiny_config("gemma3_text", attn_logit_softcapping=30.0)
    with pytest.raises(UnsupportedLayoutError, match="attention-logit soft-capping"):
        layout_of(capped)
    assert issubclass(UnsupportedLayoutError, BAAError)


def test_a_tokenizer_that_does_not_match_the_weights_is_refused(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel

    def tokenizer(size: int):
        vocab = {f"w{i}": i for i in range(size)}
        backend = tokenizers.Tokenizer(WordLevel(vocab, unk_token="w0"))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")

    hf = tiny_hf("llama")
    check_tokenizer(hf, tokenizer(VOCAB))  # as many tokens as rows
    check_tokenizer(hf, tokenizer(VOCAB - 10))  # fewer: rows padded
    with pytest.raises(CheckpointError, match=f"has 200 tokens, more than the {VOCAB} embedding rows") as info:
        check_tokenizer(hf, tokenizer(200))
    assert "\n" not in str(info.value)
    hf.save_pretrained(tmp_path / "m")
    tokenizer(200).save_pretrained(tmp_path / "m")
    with pytest.raises(CheckpointError, match="another model's tokenizer"):
        load_hf_decoder(tmp_path / "m", tokenizer=True)


# ---------------------------------------------------------------------- training through the LM task


def test_the_training_stages_run_unchanged_with_the_lm_task():
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.tasks import LANGUAGE_MODEL
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_budgeted, train_dense, train_hard

    model = tiny_model("gemma3_text").train()
    ids = torch.randint(3, VOCAB, (24, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[::3, 9:] = 0
    split = Split(ids.masked_fill(mask == 0, model.pad_id), mask, torch.zeros(24, dtype=torch.long))
    cfg = TrainConfig(batch_size=8, dense_steps=3, budgeted_steps=3, hard_steps=3, device="cpu")
    before = LANGUAGE_MODEL.evaluate(model, split, 8)["loss"]
    dense = train_dense(model, split, cfg, seed=0, progress=False, task=LANGUAGE_MODEL)
    costs = model.unit_costs(12)
    budgeted = train_budgeted(model, split, cfg, costs, seed=0, teacher=model, progress=False, task=LANGUAGE_MODEL)
    ranking = Ranking.from_scores(model.unit_importance(), costs)
    hard = train_hard(model, split, cfg, ranking, seed=0, progress=False, task=LANGUAGE_MODEL)
    assert dense.steps == budgeted.steps == hard.steps == 3
    assert all(torch.isfinite(torch.tensor(log.losses)).all() for log in (dense, budgeted, hard))
    after = LANGUAGE_MODEL.evaluate(model, split, 8)
    assert after["loss"] < before and after["perplexity"] > 1.0


def test_freeze_embeddings_keeps_a_tied_embedding_and_output_layer_and_trains_the_body():
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.tasks import LANGUAGE_MODEL
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_dense

    model = tiny_model("gemma3_text", tie_word_embeddings=True).train()
    assert model.tied_output
    ids = torch.randint(3, VOCAB, (16, 12), generator=torch.Generator().manual_seed(3))
    split = Split(ids, torch.ones_like(ids), torch.zeros(16, dtype=torch.long))
    embedding, body = model.input_embedding().weight.detach().clone(), model.hf.model.layers[0].mlp.up_proj.weight.detach().clone()
    cfg = TrainConfig(batch_size=8, dense_steps=3, device="cpu", freeze_embeddings=True)
    train_dense(model, split, cfg, seed=0, progress=False, task=LANGUAGE_MODEL)
    assert torch.equal(model.input_embedding().weight, embedding) and model.hf.lm_head.weight is model.input_embedding().weight
    assert not torch.equal(model.hf.model.layers[0].mlp.up_proj.weight, body)
    assert model.input_embedding().weight.requires_grad


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_whole_layer_leaves_under_the_budget_and_caches_nothing(layout):
    """Layers as units (``min_one_per_layer: false``): a layer whose heads and FFN groups all rank
    last leaves whole; the pruned model and its lean executor equal the masked module tree, the
    layer keeps no K/V cache, and cached decoding still equals the full forward pass."""
    model = tiny_model(layout)
    scores = model.unit_importance()
    scores = UnitGates(scores.heads - 100 * (torch.arange(3) == 1)[:, None], scores.ffn - 100 * (torch.arange(3) == 1)[:, None])
    ranking = Ranking.from_scores(scores, model.unit_costs(SEQ), min_one_per_layer=False)
    kept = ranking.kept(0.6)
    assert kept.heads[1] == [] and kept.groups[1] == [] and all(kept.heads[i] for i in (0, 2))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.6)
    ids, mask = ids_and_mask()
    real = mask.bool()
    runner = pruned.inference_module()
    with torch.no_grad():
        masked = model(ids, mask, gates=ranking.masks(0.6))
        torch.testing.assert_close(pruned(ids, mask)[real], masked[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(runner(ids, mask)[real], masked[real], atol=1e-5, rtol=1e-5)
        cache = runner.new_cache()
        pieces = [runner.step(ids[:, :6], cache, mask[:, :6])] + [runner.step(ids[:, t : t + 1], cache, mask[:, t : t + 1]) for t in range(6, SEQ)]
    assert cache.keys[1] is None and cache.keys[0] is not None
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], masked[real], atol=1e-5, rtol=1e-5)
