import random

import pytest

from budgeted_attention.serving.load import Record, bursty_arrivals, percentile, poisson_arrivals, summarise


def test_poisson_arrivals_have_the_requested_rate_and_stay_in_the_window():
    times = poisson_arrivals(50.0, 20.0, random.Random(0))
    assert all(0 <= t < 20.0 for t in times) and times == sorted(times)
    assert len(times) == pytest.approx(1000, rel=0.1)


def test_bursty_arrivals_keep_the_mean_rate_and_are_silent_between_bursts():
    times = bursty_arrivals(50.0, 20.0, random.Random(0), on_s=1.0, off_s=1.0)
    assert len(times) == pytest.approx(1000, rel=0.1)
    assert all(int(t) % 2 == 0 for t in times)  # every arrival falls in an "on" second


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
