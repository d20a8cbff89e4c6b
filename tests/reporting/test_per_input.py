"""Per-input routing tables aggregate seeds and label the learned budget."""

import copy

from budgeted_attention.reporting.per_input import difficulty_table, routed_markdown, speed_table, spread_table


def _bench(speedup: float) -> dict:
    row = {"method": "capped-routing", "budget": 0.5, "learned_budget": False, "batch_size": 1, "seq_len": 64, "mean_heads": 4.0,
           "cost": 0.5, "speedup": speedup, "ideal_speedup": 1.25, "efficiency": speedup / 1.25}
    learned = {**row, "method": "budgetformer", "budget": 1.0, "learned_budget": True}
    return {"rows": [row, learned]}


def _profile(rho: float) -> dict:
    return {
        "spearman_dense_loss": rho, "spearman_markers": 0.5,
        "by_dense_loss": [{"bin": q, "count": 10, "mean_heads": h, "dense_accuracy": 1.0} for q, h in zip(["Q1 (easiest)", "Q2", "Q3", "Q4 (hardest)"], [3, 4, 4, 5])],
        "by_markers": [{"bin": "1", "count": 20, "mean_heads": 3.5, "dense_accuracy": 1.0}, {"bin": "3", "count": 20, "mean_heads": 4.5, "dense_accuracy": 0.5}],
    }


def test_speed_table_aggregates_seeds_and_labels_the_learned_budget():
    table = speed_table({"0": _bench(1.1), "1": _bench(1.2)})
    assert "| capped-routing | 0.5 | 1 | 64 | 2 | 4.00 ± 0.00 | 0.500 ± 0.000 | 1.15x ± 0.07 | 1.25x ± 0.00 | 0.92 ± 0.06 |  |  |  |" in table
    assert "| budgetformer | learned |" in table


def test_speed_table_shows_the_static_slice_where_it_was_timed():
    bench = _bench(1.0)
    bench["rows"][0].update(static_speedup=1.2, static_efficiency=0.96, routing_share=1.0 / 1.2)
    bench["rows"].append({**bench["rows"][0], "batch_size": 32, "static_speedup": None, "static_efficiency": None, "routing_share": None})
    table = speed_table({"0": bench})
    assert "| 1.00x | 1.25x | 0.80 | 1.20x | 0.96 | 0.83 |" in table  # batch 1: routed vs the same FLOPs without routing
    assert "| capped-routing | 0.5 | 32 | 64 | 1 | 4.00 | 0.500 | 1.00x | 1.25x | 0.80 |  |  |  |" in table


def test_difficulty_table_means_over_seeds_with_marker_columns():
    table = difficulty_table({"capped-routing": {"0": {"0.5": _profile(0.2)}, "1": {"0.5": _profile(0.4)}}})
    assert "ρ(heads, markers)" in table and "heads, 3 marker(s)" in table
    assert "| capped-routing | 0.5 | 2 | 0.300 ± 0.141 | 3.00 ± 0.00 |" in table


def test_routed_markdown_holds_both_sections():
    text = routed_markdown({"bench": {"0": _bench(1.1)}, "difficulty": {"budgetformer": {"0": {"learned": _profile(0.1)}}}})
    assert "FLOP-ideal" in text and "by input difficulty" in text and "| budgetformer | learned | 1 |" in text


def test_spread_table_counts_the_validation_choices_and_means_the_scores():
    seed0 = {"0.5": {"scale": 1.0, "val_scores": {"0.0": 0.90, "0.5": 0.91, "1.0": 0.92}}}
    seed1 = {"0.5": {"scale": 0.0, "val_scores": {"0.0": 0.92, "0.5": 0.91, "1.0": 0.90}}}
    table = spread_table({"capped-routing": {"0": seed0, "1": seed1}})
    assert "| capped-routing | 0.5 | 2 | 0 (1), 1 (1) | 0: 91.00 ± 1.41; 0.5: 91.00 ± 0.00; 1: 91.00 ± 1.41 |" in table
    assert "Spread of the difficulty allocation" in routed_markdown({"spread": {"capped-routing": {"0": seed0}}})
    assert "Spread" not in routed_markdown({"spread": {"budgetformer": {"0": {}}}})


def test_static_columns_count_their_seeds_when_fewer_than_the_rows():
    old, new = _bench(1.0), _bench(1.0)
    new["rows"][0].update(static_speedup=1.2, static_efficiency=0.96, routing_share=0.8)
    table = speed_table({"0": old, "1": new})
    assert "| 1.20x (1 seeds) | 0.96 (1 seeds) | 0.80 (1 seeds) |" in table


def test_lean_table_shows_batch_one_routing_through_the_lean_copy_and_nothing_without_it():
    from budgeted_attention.reporting.per_input import lean_table

    assert lean_table({"0": _bench(1.0)}) == ""  # older records: no section
    assert "lean inference copy" not in routed_markdown({"bench": {"0": _bench(1.0)}})
    bench = _bench(1.0)
    bench["rows"][0].update(
        lean_latency_ms=8.0, lean_dense_latency_ms=11.0, lean_static_latency_ms=7.5, lean_speedup=1.375, lean_efficiency=1.1,
        lean_plain_speedup=1.5, lean_static_speedup=11.0 / 7.5, lean_static_efficiency=1.17, lean_routing_share=0.94,
    )
    table = lean_table({"0": bench})
    # a record from before the preset run: its columns stay empty
    assert "| capped-routing | 0.5 | 1 | 64 | 1 | 11.000 | 8.000 | 1.38x | 1.25x | 1.10 |  |  | 1.17 | 0.94 | 1.50x |" in table
    assert "budgetformer" not in table  # its row has no lean timing
    older = copy.deepcopy(bench)  # a seed timed before the preset run: lean columns, no preset ones
    bench["rows"][0].update(lean_preset_latency_ms=7.0, lean_preset_speedup=11.0 / 7.0, lean_preset_efficiency=1.26, lean_decision_share=0.875)
    assert "| 1.10 | 1.26 | 0.88 | 1.17 |" in lean_table({"0": bench})
    assert "| 1.26 (1 seeds) | 0.88 (1 seeds) |" in lean_table({"0": bench, "1": older})
    assert "lean inference copy" in routed_markdown({"bench": {"0": bench}})
