"""The per-input routing bench: rows per budget, FLOP-ideal from the selected heads, and at batch 1
the static slice (the same head counts without the router) in the same rounds."""

import pytest
import torch

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.per_input import LEAN_FIELDS, bench_per_input, selected_heads, static_slice
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.model.transformer import EncoderClassifier

from conftest import tiny_config


def _routed() -> EncoderClassifier:
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config())
    router = model.attach_router(RouterConfig(mode="capped"))
    with torch.no_grad():  # distinct counts per input
        router.scorer.weight.normal_(std=2.0)
        router.controller[2].weight.normal_(std=2.0)
    return model.eval()


def _batches(batch_size: int, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 29, (batch_size, 7), generator=generator), torch.ones(batch_size, 7, dtype=torch.long)) for _ in range(n)]


def test_static_slice_runs_an_inputs_head_count_without_the_router():
    model = _routed()
    static = static_slice(model)
    assert static.router is None and model.router is not None  # the routed model keeps its router
    ids, mask = _batches(1)[0]
    with torch.no_grad():
        k = selected_heads(model, [(ids, mask)], 0.5)[0][0]
        static.set_active([k] * static.n_layers)
        sliced = static(ids, mask)
        reference = model(ids, mask, gates=torch.tensor([[1.0] * k + [0.0] * (model.n_heads - k)] * model.n_layers))
    assert torch.allclose(sliced, reference, atol=1e-5)  # the prefix of k stored heads, every layer


@pytest.mark.parametrize("batch_size", [1, 3])
def test_rows_time_the_static_slice_at_batch_one_only(batch_size):
    model = _routed()
    rows = bench_per_input(
        model, static_slice(model).inference_module(), _batches(batch_size),
        [0.5], BenchConfig(rounds=1, min_run_time=0.01), method="capped-routing",
    )
    (row,) = rows
    assert row["batch_size"] == batch_size and 0 < row["cost"] <= 1 and row["ideal_speedup"] >= 1
    if batch_size == 1:
        assert row["static_latency_ms"] > 0
        assert row["routing_share"] == pytest.approx(row["speedup"] / row["static_speedup"])
        assert row["static_efficiency"] == pytest.approx(row["static_speedup"] / row["ideal_speedup"])
        # the same decisions through the lean copy, against its own dense pass and the dense reference
        assert row["lean_latency_ms"] > 0 and row["lean_static_latency_ms"] > 0
        assert row["lean_speedup"] == pytest.approx(row["lean_dense_latency_ms"] / row["lean_latency_ms"])
        assert row["lean_efficiency"] == pytest.approx(row["lean_speedup"] / row["ideal_speedup"])
        assert row["lean_plain_speedup"] == pytest.approx(row["dense_latency_ms"] / row["lean_latency_ms"])
        assert row["lean_routing_share"] == pytest.approx(row["lean_speedup"] / row["lean_static_speedup"])
        # the same head sets decided before the timing: the routed pass without the router
        assert row["lean_preset_latency_ms"] > 0
        assert row["lean_preset_efficiency"] == pytest.approx(row["lean_dense_latency_ms"] / row["lean_preset_latency_ms"] / row["ideal_speedup"])
        assert row["lean_decision_share"] == pytest.approx(row["lean_speedup"] / row["lean_preset_speedup"])
    else:
        assert row["static_latency_ms"] is None and row["routing_share"] is None
        assert all(row[key] is None for key in LEAN_FIELDS)
    assert model.router is not None and model._active == model.heads_per_layer


def test_lean_timings_run_the_lean_copies(monkeypatch):
    """The lean columns time the lean copy: routed calls with head sets, static-slice calls
    with prefixes; never a silent fallback to the module tree."""
    from budgeted_attention.model.compact import CompactEncoder

    calls = {"sets": set(), "prefix": set()}  # the copies called each way
    forward = CompactEncoder.forward

    def spy(self, *args, head_sets=None, **kwargs):
        calls["sets" if head_sets is not None else "prefix"].add(id(self))
        return forward(self, *args, head_sets=head_sets, **kwargs)

    monkeypatch.setattr(CompactEncoder, "forward", spy)
    (row,) = bench_per_input(_routed(), static_slice(_routed()).inference_module(), _batches(1), [0.25], BenchConfig(rounds=1, min_run_time=0.01), method="capped-routing")
    # one copy runs the routed sets (and its own dense pass), another the static slice's prefixes, a third the dense reference
    assert len(calls["sets"]) == 1 and len(calls["prefix"]) == 3 and calls["sets"] < calls["prefix"]
    assert row["lean_routing_share"] > 0
