"""Quantized-model rows read against their peers: agreement with the float graph, dense int8,
the smaller models' curve, and the study targets judged on them."""

from __future__ import annotations

import json

from budgeted_attention.reporting.int8 import comparison_notes, int8_comparisons, int8_notes, int8_target_failures
from budgeted_attention.reporting.report import load_run, run_section
from budgeted_attention.reporting.studies import _sweep


def _int8_row(method: str, budget: float, latency_ms: float, accuracy: float, variant: str | None = None, **extra) -> dict:
    row = {"method": method, "budget": budget, "seed": 0, "latency_ms": latency_ms, "accuracy": accuracy, **extra}
    return {**row, "variant": variant} if variant else row


def _curve_rows() -> list[dict]:
    return [
        _int8_row("dense-int8", 1.0, 10.0, 0.900),
        _int8_row("smaller-int8", 0.5, 6.0, 0.880, "l3"),
        _int8_row("smaller-int8", 0.33, 4.0, 0.800, "l2"),
        _int8_row("budgeted-hard-int8", 0.25, 3.0, 0.870),  # faster than every smaller model and more accurate
        _int8_row("budgeted-hard-int8", 0.5, 5.0, 0.820),  # the curve at 5 ms is 84 %: 2 points below it
        _int8_row("budgeted-hard-int8", 0.75, 7.0, 0.870),  # l3 is faster and 1 point more accurate
    ]


def test_comparison_notes_tell_above_from_below_the_smaller_models_curve():
    notes = {line.split(" (", 1)[0]: line for line in comparison_notes(_curve_rows())}
    assert "on or above the smaller models' int8 curve (faster than every smaller model)" in notes["- budgeted-hard-int8 b = 0.25"]
    assert "3.33x faster than dense int8 at -3.00 points (LESS accurate" in notes["- budgeted-hard-int8 b = 0.25"]
    assert "BELOW the smaller models' int8 curve: 84.00% interpolated between smaller-int8 (l2) and smaller-int8 (l3)" in notes["- budgeted-hard-int8 b = 0.5"]
    assert "BELOW the smaller models' int8 curve: smaller-int8 (l3) is faster (6.00 ms vs 7.00) and +1.00 points" in notes["- budgeted-hard-int8 b = 0.75"]
    assert comparison_notes([_int8_row("dense", 1.0, 10.0, 0.9)]) == [] and int8_notes([_int8_row("dense", 1.0, 10.0, 0.9)]) == []


def test_agreement_is_the_mean_and_minimum_over_seeds():
    rows = [_int8_row("budgeted-hard-int8", 0.5, 5.0, 0.9, agreement_with_float=a, speedup_over_dense_int8=o) | {"seed": seed}
            for seed, (a, o) in enumerate(((0.995, 1.6), (0.985, 1.8)))]
    assert int8_notes(rows)[0] == ("- budgeted-hard-int8 b = 0.5: int8 = float predictions on 99.00% of the test split (min 98.50%), "
                                   "BELOW 99% on a seed; 1.70x over dense int8 [1.60, 1.80]")
    low = [_int8_row("dense-int8", 1.0, 10.0, 0.9, agreement_with_float=0.988)]
    assert int8_notes(low)[0] == "- dense-int8 b = 1: int8 = float predictions on 98.80% of the test split (min 98.80%), BELOW 99%"
    fine = [{**r, "agreement_with_float": a} for r, a in zip(rows, (1.0, 0.995))]
    assert "BELOW" not in int8_notes(fine)[0]


def test_targets_judge_speed_at_equal_accuracy_and_the_curve():
    rows = _curve_rows()
    assert int8_target_failures(rows, 0.25, {"min_speedup_over_dense_int8": 3.0}) == [
        "3.33x over dense int8 at -3.00 points (target ≥ 3x at equal accuracy, ±0.5)"]  # fast enough, but less accurate
    assert int8_target_failures(rows, 0.25, {"on_smaller_curve": True}) == []
    assert int8_target_failures(rows, 0.5, {"on_smaller_curve": True}) == [
        "below the smaller models' int8 curve (84.00% interpolated between smaller-int8 (l2) and smaller-int8 (l3) at its latency)"]
    equal = [_int8_row("dense-int8", 1.0, 10.0, 0.900), _int8_row("budgeted-hard-int8", 0.5, 5.0, 0.897)]
    assert int8_target_failures(equal, 0.5, {"min_speedup_over_dense_int8": 1.7}) == []  # 2x at -0.3 points
    assert int8_target_failures(equal, 0.5, {"min_speedup_over_dense_int8": 2.5}) == [
        "2.00x over dense int8 at -0.30 points (target ≥ 2.5x at equal accuracy, ±0.5)"]
    assert int8_target_failures(equal, 0.5, {"on_smaller_curve": True}) == ["no smaller model's int8 row to compare with"]
    assert int8_target_failures(equal, 0.5, {}) == []
    assert [c["budget"] for c in int8_comparisons(rows)] == [0.25, 0.5, 0.75]


def test_a_sweep_target_judges_only_its_rows_against_its_reference():
    rows = [_int8_row("reference-fp32", 1.0, 20.0, 0.900, speedup=1.0), _int8_row("dense-int8", 1.0, 10.0, 0.900, speedup=2.0),
            _int8_row("budgeted-hard-int8", 0.5, 5.0, 0.885, speedup=4.0), _int8_row("budgeted-hard-int8", 0.25, 4.0, 0.5, speedup=5.0)]
    target = {"only": [{"method": "budgeted-hard-int8", "budget": 0.5}], "reference": "reference-fp32", "max_drop": 1.0,
              "min_speedup": 3.5, "min_speedup_over_dense_int8": 1.7}
    _, out = _sweep({"rows": rows}, {"kind": "sweep", "target": target})
    judged = {(r["key"]["method"], r["key"]["budget"]): (r["fail"], r["untargeted"]) for r in out}
    assert judged[("budgeted-hard-int8", 0.5)] == (
        "2.00x over dense int8 at -1.50 points (target ≥ 1.7x at equal accuracy, ±0.5); 1.50 points below reference-fp32 (target ≤ 1)", False)
    assert judged[("budgeted-hard-int8", 0.25)] == (None, True)  # 40 points below, but `only` leaves it unjudged
    assert judged[("reference-fp32", 1.0)] == (None, True)
    assert [r["brief"] for r in out if r["key"]["method"] == "budgeted-hard-int8"][1].endswith("(reference-fp32 90.00), 4.00x measured")
    _, untargeted = _sweep({"rows": rows}, {"kind": "sweep"})
    assert all(r["untargeted"] and r["fail"] is None for r in untargeted)  # no target: no row says "meets"
    _, unjudged = _sweep({"rows": rows}, {"kind": "sweep", "target": {"reference": "reference-fp32"}})
    assert all(r["untargeted"] for r in unjudged)  # a reference judges nothing by itself
    _, missing = _sweep({"rows": rows}, {"kind": "sweep", "target": {**target, "reference": "referense-fp32"}})
    assert "no referense-fp32 rows at b = 1 to compare with" in next(r["fail"] for r in missing if r["key"]["budget"] == 0.5)
    assert int8_target_failures(rows, 0.75, target) == ["no budgeted-hard-int8 row at b = 0.75 to compare with its peers"]


def test_the_per_run_report_shows_int8_notes_and_a_scripts_command(tmp_path):
    run = tmp_path / "int8"
    run.mkdir()
    rows = [_int8_row("dense-int8", 1.0, 10.0, 0.9, agreement_with_float=0.99),
            _int8_row("budgeted-hard-int8", 0.5, 5.0, 0.9, agreement_with_float=1.0, speedup_over_dense_int8=2.0)]
    (run / "results.json").write_text(json.dumps({"rows": rows}))
    (run / "run_info.json").write_text(json.dumps({"seeds": [0], "command": ["python", "benchmarks/int8_peers.py", "runs/m", "--out", "runs/int8"]}))
    text = run_section(load_run(run), figures_dir=None, out=None)
    assert "```\npython benchmarks/int8_peers.py runs/m --out runs/int8\n```" in text
    assert "### int8: int8 graphs against their float graphs and against dense int8" in text
    assert "- budgeted-hard-int8 b = 0.5 (90.00%, 5.00 ms): 2.00x faster than dense int8 at +0.00 points (equal accuracy, ±0.5)" in text
