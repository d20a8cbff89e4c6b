"""benchmarks/unit_costs.py: the least-squares split of measured savings into per-head and per-neuron time."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "unit_costs.py"


def _script():
    spec = importlib.util.spec_from_file_location("unit_costs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("unit_costs", module)
    spec.loader.exec_module(module)
    return module


def test_fit_recovers_the_per_unit_times_of_exact_savings():
    fit = _script().fit
    heads, neurons = [36, 0, 54], [0, 4608, 6912]  # the script's three MiniLM shapes
    per_head, per_neuron = fit([h * 0.09 + n * 0.0005 for h, n in zip(heads, neurons)], heads, neurons)
    assert per_head == pytest.approx(0.09) and per_neuron == pytest.approx(0.0005)


def test_fit_is_least_squares_without_an_intercept():
    fit = _script().fit
    per_head, per_neuron = fit([1.0, 1.0, 2.2], [1, 0, 1], [0, 1, 1])  # inconsistent by 0.2: split evenly
    assert per_head == pytest.approx(per_neuron) and per_head == pytest.approx((1.0 + 2.2) / 3, rel=1e-6)
