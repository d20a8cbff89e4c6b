"""The ladder comparison: each pruned curve read at each ladder model's measured speedup, per seed."""

import pytest

from budgeted_attention.reporting.ladder import confidence_interval, interpolate, ladder_comparison, ladder_markdown


def _hard(seed, budget, accuracy, speedup):
    return {"method": "budgeted-hard", "budget": budget, "seed": seed, "accuracy": accuracy, "speedup": speedup, "cost_kind": "kept-heads"}


def _ladder(seed, cost, accuracy, speedup, variant=None, heads=None, ffn=None):
    return {"method": "ladder", "budget": cost, "seed": seed, "accuracy": accuracy, "speedup": speedup,
            "cost_kind": "smaller-dense", "variant": variant, "heads_per_layer": heads, "ffn_per_layer": ffn}


def _rows():
    rows = []
    for seed, shift in ((0, 0.0), (1, 0.02)):
        rows += [_hard(seed, 1.0, 0.90 + shift, None), _hard(seed, 0.5, 0.80 + shift, 2.0), _hard(seed, 0.25, 0.70 + shift, 3.0)]
        rows += [_ladder(seed, 0.6, 0.84, 1.5), _ladder(seed, 0.3, 0.80, 2.5, heads=[4, 4], ffn=[64, 64]), _ladder(seed, 0.1, 0.60, 5.0, "small")]
    rows += [{"method": "budgeted", "budget": 0.5, "seed": 0, "accuracy": 0.99, "speedup": None, "cost_kind": "soft-estimate"}]
    return rows


def test_interpolate_inside_at_the_ends_and_outside():
    curve = [(1.0, 0.9), (2.0, 0.8)]
    assert interpolate(curve, 1.5) == pytest.approx(0.85)
    assert interpolate(curve, 1.0) == 0.9 and interpolate(curve, 2.0) == 0.8
    assert interpolate(curve, 2.5) is None and interpolate([], 1.0) is None


def test_each_ladder_model_is_matched_per_seed_at_its_speedup():
    by_ladder = {entry["ladder"]: entry for entry in ladder_comparison(_rows())}
    assert set(by_ladder) == {"ladder (cost 0.60)", "2 layers, 4 heads, FFN 64 (cost 0.30)", "small (cost 0.10)"}  # no soft curve
    slow = by_ladder["ladder (cost 0.60)"]  # 1.5x: the curve reads 0.85 / 0.87 against 0.84
    assert slow["matched"] == 2 and slow["above"] == 2
    assert slow["curve_accuracy"][0] == pytest.approx(0.86) and slow["difference"][0] == pytest.approx(0.02)
    mid = by_ladder["2 layers, 4 heads, FFN 64 (cost 0.30)"]  # 2.5x: 0.75 / 0.77 against 0.80
    assert mid["above"] == 0 and mid["difference"][0] == pytest.approx(-0.04)
    fast = by_ladder["small (cost 0.10)"]  # 5x: faster than every budget
    assert fast["matched"] == 0 and fast["speedup"][0] == pytest.approx(5.0)


def test_markdown_gives_a_verdict_per_row_and_nothing_without_a_ladder():
    table = ladder_markdown(_rows())
    # +2 ± 1.41 over 2 seeds: t(0.975, 1) = 12.706, half-width 12.706 x 1.41 / sqrt(2) = 12.71 points.
    assert ("| budgeted-hard | ladder (cost 0.60) | 2 of 2 | 1.50x | 84.00 ± 0.00 | 86.00 ± 1.41 | +2.00 ± 1.41 | [-10.71, +14.71] | "
            "on (a tie: the 95% CI includes 0; mean above); above in 2 of 2 seeds |") in table
    assert "mean below); above in 0 of 2 seeds" in table
    assert "no match in 2 seeds: faster than every budget" in table
    assert ladder_markdown([row for row in _rows() if row["method"] != "ladder"]) == ""
    assert ladder_markdown([row for row in _rows() if row["method"] == "ladder"]) == ""


def test_a_model_without_a_match_says_why_and_one_seed_has_no_spread():
    rows = [_hard(0, 1.0, 0.90, 1.05), _hard(0, 0.5, 0.80, 2.0), _hard(1, 1.0, 0.90, None), _hard(1, 0.5, 0.80, 2.0)]
    rows += [_ladder(0, 0.9, 0.95, 1.02), _ladder(1, 0.9, 0.95, 1.5)]  # seed 0: slower than its full model
    rows += [_ladder(2, 0.6, 0.70, 1.5)]  # seed 2 has no curve
    rows += [_ladder(0, 0.5, float("nan"), 1.5)]  # a NaN accuracy is no ladder point
    (entry,) = [e for e in ladder_comparison(rows) if e["ladder"] == "ladder (cost 0.90)"]
    assert entry["matched"] == 1 and entry["unmatched"] == {"slower than the full model": 1}
    table = ladder_markdown(rows)
    assert "below (1 seed, no interval); above in 0 of 1 seeds; no match in 1 seed: slower than the full model |" in table
    assert "no match in 1 seed: no curve for the seed |" in table
    assert "nan" not in table and "cost 0.50" not in table


def test_a_gap_within_the_confidence_interval_is_a_tie():
    rows = []
    for seed, accuracy in ((0, 0.83), (1, 0.88)):  # the curve reads 0.85 at 1.5x in both seeds
        rows += [_hard(seed, 1.0, 0.90, None), _hard(seed, 0.5, 0.80, 2.0), _ladder(seed, 0.6, accuracy, 1.5, heads=[4], ffn=[64])]
    table = ladder_markdown(rows)
    assert "| budgeted-hard | 1 layer, 4 heads, FFN 64 (cost 0.60) | 2 of 2 |" in table
    assert "| -0.50 ± 3.54 | [-32.27, +31.27] | on (a tie: the 95% CI includes 0; mean below); above in 1 of 2 seeds |" in table


def _seeds(differences):
    """Rows where the curve reads 0.85 at 1.5x in every seed and the ladder model 0.85 - difference."""
    rows = []
    for seed, difference in enumerate(differences):
        rows += [_hard(seed, 1.0, 0.90, None), _hard(seed, 0.5, 0.80, 2.0), _ladder(seed, 0.6, 0.85 - difference, 1.5, "small")]
    return rows


def test_a_consistent_gap_over_enough_seeds_is_above_or_below():
    above = ladder_markdown(_seeds([0.02, 0.03, 0.01, 0.02, 0.025]))
    assert "above (95% CI above 0); above in 5 of 5 seeds" in above
    below = ladder_markdown(_seeds([-0.02, -0.03, -0.01, -0.02, -0.025]))
    assert "below (95% CI below 0); above in 0 of 5 seeds" in below
    noisy = ladder_markdown(_seeds([0.05, -0.04, 0.03, -0.02, 0.01]))
    assert "on (a tie: the 95% CI includes 0; mean above)" in noisy


def test_confidence_interval_uses_students_t():
    assert confidence_interval(0.0, 1.0, 2) == pytest.approx((-12.706 / 2**0.5, 12.706 / 2**0.5))
    low, high = confidence_interval(1.0, 2.0, 9)  # t(0.975, 8) = 2.306
    assert (high - low) / 2 == pytest.approx(2.306 * 2.0 / 3.0)
    assert confidence_interval(0.0, 1.0, 31)[1] == pytest.approx(2.042 / 31**0.5)  # df 30, the table's last
    assert confidence_interval(0.0, 1.0, 100)[1] == pytest.approx(0.2042)  # beyond: df 30's value (conservative)
    with pytest.raises(ValueError, match="at least 2"):
        confidence_interval(0.0, 0.0, 1)
