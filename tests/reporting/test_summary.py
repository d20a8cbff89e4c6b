"""Headlines pick operating points by validation accuracy, never by test accuracy."""

from budgeted_attention.reporting.summary import accuracy_at_cost, headline, headline_markdown


def _row(budget, cost, test, val, seed=0, method="budgeted"):
    return {"method": method, "budget": budget, "seed": seed, "accuracy": test, "val_accuracy": val,
            "cost": cost, "cost_kind": "soft-estimate", "steps": 1000}


def test_higher_test_but_lower_val_is_not_picked():
    rows = [_row(0.2, 0.18, test=0.99, val=0.90), _row(0.3, 0.28, test=0.95, val=0.93)]
    best = accuracy_at_cost(rows, "budgeted", 0, 0.30)
    assert best is rows[1]
    summary = headline(rows)
    assert summary["per_seed"][0]["accuracy_at_cost_0.30"] == 0.95


def test_ties_go_to_lower_cost_and_cap_is_respected():
    rows = [_row(0.4, 0.35, 0.9, 0.95), _row(0.3, 0.25, 0.8, 0.95), _row(0.6, 0.55, 1.0, 1.0)]
    assert accuracy_at_cost(rows, "budgeted", 0, 0.50)["budget"] == 0.3
    assert accuracy_at_cost(rows, "budgeted", 0, 0.10) is None


def test_rows_without_validation_cannot_be_picked():
    old = [{"method": "budgeted", "budget": 0.3, "seed": 0, "accuracy": 0.99, "estimated_cost": 0.2}]
    assert accuracy_at_cost(old, "budgeted", 0, 0.5) is None
    mixed = old + [_row(0.4, 0.45, test=0.5, val=None), _row(0.5, 0.45, test=0.6, val=0.7)]
    assert accuracy_at_cost(mixed, "budgeted", 0, 0.5)["accuracy"] == 0.6
    text = headline_markdown(headline(old))
    assert "no validation figure" in text and "99.00" not in text.split("Mean")[0]


def test_old_rows_cost_falls_back_to_estimated_cost():
    rows = [{"method": "budgeted", "budget": 0.3, "seed": 0, "accuracy": 0.9, "val_accuracy": 0.8, "estimated_cost": 0.6}]
    assert accuracy_at_cost(rows, "budgeted", 0, 0.5) is None
    assert accuracy_at_cost(rows, "budgeted", 0, 0.6) is rows[0]
    assert headline(rows)["per_seed"][0]["max_cost_minus_budget"] == 0.6 - 0.3


def test_full_budget_gap_compares_b099_with_b1():
    from budgeted_attention.reporting.summary import full_budget_gap

    rows = [
        {"method": "budgeted", "seed": 0, "budget": 0.99, "accuracy": 0.90},
        {"method": "budgeted", "seed": 0, "budget": 1.0, "accuracy": 0.95},
        {"method": "budgeted-hard", "seed": 0, "budget": 1.0, "accuracy": 0.95},
        {"method": "dense", "seed": 0, "budget": 1.0, "accuracy": 0.5},
    ]
    gaps = full_budget_gap(rows)
    assert len(gaps) == 1 and gaps[0]["method"] == "budgeted" and abs(gaps[0]["gap_points"] - 5.0) < 1e-9
