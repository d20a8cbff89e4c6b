"""benchmarks/unit_costs.py: the split of measured savings into per-head and per-neuron time, and
the head weight it gives."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "unit_costs.py"


def _script():
    spec = importlib.util.spec_from_file_location("unit_costs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # numpy only at import: the timing stack loads in main()
    return module


HEADS, NEURONS = [36, 0, 54], [0, 4608, 6912]  # the script's three MiniLM shapes (6 layers)
HEAD_FLOPS, GROUP_FLOPS, GROUP = 14_680_064, 25_165_824, 128


def test_fit_recovers_the_per_unit_times_of_exact_savings():
    fit = _script().fit
    per_head, per_neuron = fit([h * 0.09 + n * 0.0005 for h, n in zip(HEADS, NEURONS)], HEADS, NEURONS)
    assert per_head == pytest.approx(0.09) and per_neuron == pytest.approx(0.0005)


def test_fit_is_least_squares_without_an_intercept():
    fit = _script().fit
    per_head, per_neuron = fit([1.0, 1.0, 2.2], [1, 0, 1], [0, 1, 1])  # inconsistent by 0.2: split evenly
    assert per_head == pytest.approx(per_neuron) and per_head == pytest.approx((1.0 + 2.2) / 3, rel=1e-6)


def test_time_proportional_to_flops_weighs_a_head_1_and_dearer_heads_more():
    script = _script()
    ms_per_flop = 2e-9
    for factor in (1.0, 1.8):
        savings = [h * HEAD_FLOPS * ms_per_flop * factor + n * (GROUP_FLOPS / GROUP) * ms_per_flop for h, n in zip(HEADS, NEURONS)]
        per_head, per_neuron = script.fit(savings, HEADS, NEURONS)
        assert script.head_weight(per_head, per_neuron, HEAD_FLOPS, GROUP_FLOPS, GROUP) == pytest.approx(factor)


def test_a_fit_without_positive_unit_times_is_refused_by_name():
    with pytest.raises(ValueError, match="ms per neuron: time too noisy"):
        _script().head_weight(0.08, -1e-5, HEAD_FLOPS, GROUP_FLOPS, GROUP)
