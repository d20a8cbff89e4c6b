import random

import pytest

from budgeted_attention.reporting.serve_load import serve_load_markdown
from budgeted_attention.reporting.serve_load import peak_rate
from budgeted_attention.serving.load import Record, served_budgets, bursty_arrivals, percentile, poisson_arrivals, summarise


def test_poisson_arrivals_have_the_requested_rate_and_stay_in_the_window():
    times = poisson_arrivals(50.0, 20.0, random.Random(0))
    assert all(0 <= t < 20.0 for t in times) and times == sorted(times)
    assert len(times) == pytest.approx(1000, rel=0.1)


def test_bursty_arrivals_keep_the_mean_rate_and_are_silent_between_bursts():
    times = bursty_arrivals(50.0, 20.0, random.Random(0), on_s=1.0, off_s=1.0)
    assert len(times) == pytest.approx(1000, rel=0.1)
    assert all(int(t) % 2 == 0 for t in times)  # every arrival falls in an "on" second


def test_peak_rate_is_the_in_burst_rate_for_bursty_arrivals():
    assert peak_rate("poisson", 40.0, (1.0, 1.0)) == 40.0
    assert peak_rate("bursty", 40.0, (1.0, 1.0)) == 80.0
    assert peak_rate("bursty", 40.0, (1.0, 3.0)) == 160.0


def test_report_compares_the_in_burst_rate_with_the_capacity_at_each_budget():
    summary = {"requests": 1, "throughput_rps": 1.0, "p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0, "slo_attainment": 1.0,
               "effective_accuracy": 1.0, "accuracy_answered": 1.0, "shed": 0, "server_errors": 0, "no_response": 0, "mean_budget": 1.0}
    result = {"setting": {"bursty_on_off_s": [1.0, 1.0]}, "capacity_rps": 100.0, "deadline_ms": 50.0,
              "capacity_by_budget": {"1": 100.0, "0.25": 200.0},
              "trials": [{"arrivals": a, "load": 1.5, "mode": m, "summary": summary} for a in ("poisson", "bursty") for m in ("slo", "fixed-1")]}
    text = serve_load_markdown(result)
    assert "| poisson | 1.5x | 150 | 1.50 | 0.75 |" in text
    assert "| bursty | 1.5x | 300 | 3.00 | 1.50 |" in text  # 1 s bursts at twice the mean rate outrun b = 0.25
    assert text.count("| bursty | 1.5x | 300 |") == 1  # one row per (arrivals, load), not per mode
    assert "capacity_by_budget" not in serve_load_markdown({k: v for k, v in result.items() if k != "capacity_by_budget"})


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_summary_scores_every_request_against_the_deadline():
    records = [
        Record(0.0, 10.0, 200, label=1, predicted=1, budget=1.0),   # in time, correct
        Record(0.1, 20.0, 200, label=1, predicted=0, budget=0.5),   # in time, wrong
        Record(0.2, 500.0, 200, label=1, predicted=1, budget=1.0),  # late
        Record(0.3, 1.0, 503),                                      # shed
        Record(0.4, 1.0, 500),                                      # server error
        Record(0.5, 30000.0, 0),                                    # no response
    ]
    s = summarise(records, deadline_ms=100.0, seconds=1.0)
    assert s["requests"] == 6 and s["answered"] == 3
    assert s["slo_attainment"] == pytest.approx(2 / 6)
    assert s["effective_accuracy"] == pytest.approx(1 / 6)
    assert s["accuracy_answered"] == pytest.approx(2 / 3)
    assert (s["shed"], s["server_errors"], s["no_response"]) == (1, 1, 1)
    assert s["mean_budget"] == pytest.approx(2.5 / 3) and s["budget_counts"] == {"0.5": 1, "1": 2}
    assert s["throughput_rps"] == pytest.approx(3 / 1.0)  # the last answer came at 0.7 s, inside the 1 s window


def test_repeated_trials_get_a_mean_std_and_min_table():
    def summary(attainment: float) -> dict:
        return {"requests": 10, "throughput_rps": 1.0, "p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0, "slo_attainment": attainment,
                "effective_accuracy": attainment - 0.1, "accuracy_answered": 1.0, "shed": 0, "server_errors": 0, "no_response": 0,
                "mean_budget": 0.5}

    trials = [{"arrivals": "bursty", "load": 1.5, "mode": "slo", "repeat": r, "summary": summary(a)} for r, a in enumerate((0.99, 0.95))]
    text = serve_load_markdown({"setting": {}, "capacity_rps": 100.0, "deadline_ms": 50.0, "trials": trials})
    assert "| bursty | 1.5x | slo | 1 | 10 |" in text  # each repeat is a row
    assert "| bursty | 1.5x | slo | 2 | 97.0 ± 2.8 | 95.0 | 87.0 ± 2.8 | 85.0 | 0 |" in text
    single = serve_load_markdown({"setting": {}, "capacity_rps": 100.0, "deadline_ms": 50.0, "trials": trials[:1]})
    assert "Over the repeats" not in single


def test_a_given_capacity_is_reported_beside_the_measured_one():
    base = {"setting": {"capacity_concurrency": 32}, "deadline_ms": 50.0, "trials": []}
    given = serve_load_markdown({**base, "capacity_rps": 90.0, "measured_capacity_rps": 84.0})
    assert "90.0 requests/s (given; 84.0 measured in this run). Deadline: 50.0 ms" in given
    measured = serve_load_markdown({**base, "capacity_rps": 84.0, "measured_capacity_rps": 84.0})
    assert "84.0 requests/s. Deadline: 50.0 ms" in measured


def test_a_given_deadline_is_reported_beside_the_measured_one():
    base = {"setting": {}, "capacity_rps": 80.0, "trials": []}
    assert "Deadline: 86.0 ms (given; the p95 of fixed b = 1 at 0.5x capacity (Poisson) measured in this run: 91.1 ms);" in \
        serve_load_markdown({**base, "deadline_ms": 86.0, "measured_deadline_ms": 91.1})
    assert "Deadline: 86.0 ms = the p95 of fixed b = 1" in serve_load_markdown({**base, "deadline_ms": 86.0})


def test_capacity_budgets_are_labelled_with_the_budget_that_runs():
    served = [0.1, 0.25, 0.5, 0.75, 1.0]
    budgets, moved = served_budgets([0.5, 0.3, 0.25, 1.0, 0.05], served)
    assert budgets == [0.5, 0.25, 0.1]  # 0.3 runs at 0.25 (once); b = 1 left out
    assert moved == {0.3: 0.25, 0.05: 0.1}


def test_report_names_the_ab_variant_and_keeps_its_trials_apart():
    summary = {"requests": 1, "throughput_rps": 1.0, "p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0, "slo_attainment": 0.9,
               "effective_accuracy": 0.8, "accuracy_answered": 0.9, "shed": 0, "server_errors": 0, "no_response": 0, "mean_budget": 0.5}
    trials = [{"arrivals": "bursty", "load": 1.5, "mode": m, "repeat": r, "summary": summary}
              for r in range(2) for m in ("slo", "slo [engine_process=true]")]
    result = {"setting": {"variant": {"settings": ["engine_process=true"], "server_command": "baa serve r --set engine_process=true"}},
              "capacity_rps": 100.0, "deadline_ms": 50.0, "trials": trials}
    text = serve_load_markdown(result)
    assert "A/B: a second server (`baa serve r --set engine_process=true`) adds `engine_process=true`" in text
    assert "| bursty | 1.5x | slo | 2 |" in text and "| bursty | 1.5x | slo [engine_process=true] | 2 |" in text
    assert "the first server first in every repeat" in text  # no order recorded: the runs before alternation
    trials[2]["order"] = 1
    assert "the second server first on odd repeats" in serve_load_markdown(result)
    assert "Load generator pinned" not in serve_load_markdown(result)
    result["setting"]["loadgen_cpus"] = [0]
    assert "Load generator pinned to CPU(s) 0 (`--loadgen-cpus`)" in serve_load_markdown(result)
