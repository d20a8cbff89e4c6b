import pytest
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.benchmark.reference import PlainEncoder
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget

from conftest import randomize_gates, tiny_config

# The compute kernels whose choice decides latency; bookkeeping ops (views, mask checks) are not.
HEAVY = ("linear", "addmm", "scaled_dot_product_attention", "layer_norm", "gelu", "embedding")


class KernelLog(TorchFunctionMode):
    """Records every heavy torch function call as (name, shapes and strides of tensor args)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = resolve_name(func) or getattr(func, "__name__", repr(func))
        if name.rsplit(".", 1)[-1] in HEAVY:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            self.calls.append((name.rsplit(".", 1)[-1], tuple((tuple(t.shape), t.stride(), t.dtype) for t in tensors)))
        return func(*args, **kwargs)


def _model(**overrides) -> EncoderClassifier:
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(**overrides))
    with torch.no_grad():  # non-zero biases, so a mis-copied bias shows up
        for block in model.blocks:
            block.attn.qkv_bias.normal_(std=0.1)
            block.attn.out_bias.normal_(std=0.1)
    randomize_gates(model)
    return model.eval()


def _padded(batch: int, seq: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
    lengths[0] = seq  # at least one full row, like a batch padded to its longest example
    mask = (torch.arange(seq) < lengths.unsqueeze(1)).long()
    ids = torch.randint(1, 29, (batch, seq), generator=gen).masked_fill(mask == 0, 0)
    return ids, mask


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("d_ff", [48, 0])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("seq", [11, 16])  # 16 == max_len of tiny_config
def test_logits_equal_model_at_full_budget(pooling, d_ff, padded, seq):
    model = _model(pooling=pooling, d_ff=d_ff)
    assert seq <= model.config.max_len
    ids, mask = _padded(5, seq)
    if not padded:
        mask = torch.ones_like(mask)
    plain = PlainEncoder(model)
    with torch.no_grad():
        expected = model(ids, mask)
        assert torch.allclose(plain(ids, mask), expected, atol=1e-5)
        assert torch.allclose(model(ids, mask, budget=1.0), expected, atol=1e-5)
        # No mask at all is the model's unpadded path too.
        assert torch.allclose(plain(ids), model(ids), atol=1e-5)


def test_padding_matters_for_mean_pooling():
    # Guards the equality test above against a vacuous pass: the mask must change the logits.
    model = _model(pooling="mean")
    ids, mask = _padded(5, 11)
    plain = PlainEncoder(model)
    with torch.no_grad():
        assert not torch.allclose(plain(ids, mask), plain(ids), atol=1e-4)


def test_refuses_pruned_model():
    model = _model()
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(0))))
    pruned = prune_to_budget(model, ranking, 0.5)
    assert pruned.config.is_pruned
    with pytest.raises(ValueError, match="unpruned"):
        PlainEncoder(pruned)


def test_refuses_model_serving_a_head_prefix():
    model = _model()
    model.set_active([4, 2, 4])
    with pytest.raises(ValueError, match="active"):
        PlainEncoder(model)


def test_rejects_too_long_input():
    plain = PlainEncoder(_model())
    with pytest.raises(ValueError, match="max_len"):
        plain(torch.zeros(1, 17, dtype=torch.long))


def test_weights_are_copied_not_shared():
    model = _model()
    plain = PlainEncoder(model)
    ids, mask = _padded(3, 11)
    with torch.no_grad():
        before = plain(ids, mask)
        model.blocks[0].attn.qkv_weight.add_(1.0)
        assert torch.equal(plain(ids, mask), before)


def test_one_fused_qkv_projection_and_no_gate_parameters():
    # head_dim 6 makes n_heads * head_dim (24) differ from d_model (32) and d_ff (48), so a
    # separate Q, K or V projection would be recognisable by its output size.
    model = _model(head_dim=6)
    cfg = model.config
    plain = PlainEncoder(model)
    ids, mask = _padded(2, 9)
    with torch.no_grad(), KernelLog() as log:
        plain(ids, mask)
    linear_out = [args[1][0][0] for name, args in log.calls if name == "linear"]
    assert linear_out.count(3 * cfg.n_heads * cfg.head_dim) == cfg.n_layers
    assert cfg.n_heads * cfg.head_dim not in linear_out
    assert [name for name, _ in log.calls].count("addmm") == cfg.n_layers
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == cfg.n_heads * cfg.head_dim for m in plain.modules())
    assert not any("gate" in name for name, _ in plain.named_parameters())


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("padded", [False, True])
def test_same_kernels_shapes_and_strides_as_model_dense_path(pooling, padded):
    # Like-for-like: the reference runs the model's dense-path kernels in the same order with
    # the same operand shapes and strides (so SDPA sees identically laid-out q/k/v views).
    model = _model(pooling=pooling)
    plain = PlainEncoder(model)
    ids, mask = _padded(4, 13)
    if not padded:
        mask = torch.ones_like(mask)
    with torch.no_grad():
        with KernelLog() as model_log:
            model(ids, mask)
        with KernelLog() as plain_log:
            plain(ids, mask)
    assert plain_log.calls == model_log.calls
    assert [n for n, _ in plain_log.calls].count("scaled_dot_product_attention") == model.config.n_layers
