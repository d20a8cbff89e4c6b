import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgeted_attention.serving.latency import Arrivals, LatencyModel, calibrate, monotone, pick_budget

TABLE = {0.5: {1: 2.0, 8: 8.0}, 1.0: {1: 4.0, 8: 16.0}}


def test_prediction_interpolates_in_texts_times_tokens():
    model = LatencyModel(TABLE, seq_len=10)
    assert model.predict_ms(1.0, 1, 10) == pytest.approx(4.0)
    assert model.predict_ms(1.0, 8, 10) == pytest.approx(16.0)
    assert model.predict_ms(1.0, 4, 20) == pytest.approx(16.0)  # 4 texts of 20 tokens = 8 calibration texts
    assert model.predict_ms(0.5, 16, 10) == pytest.approx(8.0 + 6 / 7 * 8)  # extrapolated on the last slope


def test_live_timings_correct_every_budget_and_recover():
    model = LatencyModel(TABLE, seq_len=10, smoothing=0.5)
    model.observe(1.0, 1, 10, 8.0)  # twice as slow as calibrated
    assert model.factor == pytest.approx(1.5)
    assert model.predict_ms(1.0, 1, 10) == pytest.approx(6.0)
    assert model.predict_ms(0.5, 1, 10) == pytest.approx(3.0)  # the machine slowed down for every budget
    for _ in range(20):  # only the cheap budget runs now, at its calibrated speed
        model.observe(0.5, 1, 10, 2.0)
    assert model.predict_ms(1.0, 1, 10) == pytest.approx(4.0, rel=0.01)  # b = 1 recovers without running


def test_backlog_batches_at_a_fixed_budget_are_priced_at_it():
    model = LatencyModel(TABLE, seq_len=10)
    # The SLO batch fits at b=1 (4 ms) but an explicit b=1 batch of 8 (16 ms) behind it must also
    # fit its 25 ms deadline: 4 + 16 = 20 at b=1 for the SLO batch, fine; at a 19 ms deadline only
    # a cheaper SLO batch (2 + 16 = 18) keeps it on time.
    assert pick_budget(model, [(1, 10, 100.0), (8, 10, 25.0, 1.0)], 0.0, 0.5) == 1.0
    assert pick_budget(model, [(1, 10, 100.0), (8, 10, 19.0, 1.0)], 0.0, 0.5) == 0.5


def test_monotone_removes_noisy_inversions():
    noisy = {0.25: {1: 9.0, 4: 3.0}, 1.0: {1: 2.0, 4: 5.0}}
    fixed = monotone(noisy)
    assert fixed[0.25][1] == 2.0  # lowered to the faster cell that does more work
    assert fixed[0.25][4] == 3.0 and fixed[1.0] == {1: 2.0, 4: 5.0}


@given(st.dictionaries(st.sampled_from([0.25, 0.5, 0.75, 1.0]), st.dictionaries(st.sampled_from([1, 2, 8]), st.floats(0.1, 100)), min_size=1))
def test_monotone_table_never_rewards_more_work(table):
    fixed = monotone(table)
    for b, sizes in fixed.items():
        for n, ms in sizes.items():
            for b2, sizes2 in fixed.items():
                for n2, ms2 in sizes2.items():
                    if b2 >= b and n2 >= n:
                        assert ms <= ms2 + 1e-12


def test_pick_budget_takes_the_largest_budget_that_keeps_the_backlog_on_time():
    model = LatencyModel(TABLE, seq_len=10)
    assert pick_budget(model, [(1, 10, 100.0)], 0.0, 0.5) == 1.0
    assert pick_budget(model, [(1, 10, 3.0)], 0.0, 0.5) == 0.5  # 4 ms at b=1 misses a 3 ms deadline
    # This batch alone fits at b=1, but the queue behind it would then be late.
    backlog = [(1, 10, 5.0), (8, 10, 14.0)]
    assert pick_budget(model, backlog, 0.0, 0.5) == 0.5
    assert pick_budget(model, [(1, 10, 1.0)], 0.0, 0.5) == 0.5  # nothing fits: the floor
    assert pick_budget(model, [(1, 10, 1.0)], 0.0, 1.0) == 1.0  # never below the floor
    assert pick_budget(model, [(1, 10, math.inf)], 0.0, 0.5) == 1.0


def test_a_budget_that_would_strand_the_next_arrivals_is_refused():
    model = LatencyModel(TABLE, seq_len=10)
    batch = [(8, 10, 100.0)]  # on time at b = 1 (16 ms)
    assert pick_budget(model, batch, 0.0, 0.5) == 1.0
    # 1 text/ms arrives meanwhile: 16 texts queued behind a 16 ms batch; the oldest 8 (arrived at
    # 0 ms, due at 20 ms) would finish at 16 + 8 = 24 ms even at the floor, so b = 1 is refused.
    burst = Arrivals(rate_per_ms=1.0, n_tokens=10, latency_ms=20.0, max_batch=8)
    assert pick_budget(model, batch, 0.0, 0.5, burst) == 0.5
    # A trickle (about 1 text in 16 ms) is still served on time at the floor after b = 1: 16 + 2 <= 20.
    trickle = Arrivals(rate_per_ms=0.05, n_tokens=10, latency_ms=20.0, max_batch=8)
    assert pick_budget(model, batch, 0.0, 0.5, trickle) == 1.0
    assert pick_budget(model, batch, 0.0, 0.5, Arrivals(0.0, 10, 20.0, 8)) == 1.0


def test_calibrate_times_every_budget_and_batch_size():
    calls = []

    def run(budget, size):
        calls.append((budget, size))
        return budget * size / 1000

    model = calibrate(run, [0.5, 1.0], [1, 4], seq_len=8, warmup=1, repeats=2)
    assert model.table == {0.5: {1: 0.5, 4: 2.0}, 1.0: {1: 1.0, 4: 4.0}}
    assert len(calls) == 2 * 2 * 3


def test_empty_table_is_refused():
    with pytest.raises(ValueError, match="empty"):
        LatencyModel({}, seq_len=8)
