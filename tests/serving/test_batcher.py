import asyncio
import time

import pytest
import torch

from budgeted_attention.serving.batcher import SLO, Batcher, DeadlineExpired, Job, Overloaded, now_ms
from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.latency import LatencyModel

BUDGETS = [0.5, 1.0]


class FakeRunner:
    """Sleeps ``ms_per_text[budget]`` per text; records every batch; row i's probability is its first id."""

    def __init__(self, ms_per_text=None):
        self.ms_per_text = ms_per_text or {0.5: 1.0, 1.0: 2.0}
        self.batches = []

    def run(self, ids, budget):
        self.batches.append((budget, len(ids)))
        time.sleep(self.ms_per_text[budget] * len(ids) / 1e3)
        return torch.tensor([[float(x[0]), 0.0] for x in ids])


def latency_model(runner):
    return LatencyModel({b: {1: runner.ms_per_text[b], 8: 8 * runner.ms_per_text[b]} for b in BUDGETS}, seq_len=4, smoothing=0.0)


def make(runner, **settings):
    cfg = ServeConfig(budgets=BUDGETS, min_budget=0.5, **settings)
    return Batcher(runner, cfg, latency_model(runner), floor=0.5)


def run(coroutine):
    return asyncio.run(coroutine)


def test_requests_at_the_same_budget_share_a_batch_and_keep_their_rows():
    async def main():
        runner = FakeRunner()
        batcher = make(runner, max_wait_ms=50.0, max_batch_size=8)
        batcher.start()
        results = await asyncio.gather(
            batcher.submit([[1, 5]], 1.0, None),
            batcher.submit([[2, 5], [3, 5]], 1.0, None),
            batcher.submit([[4, 5]], 0.5, None),
        )
        await batcher.drain()
        return runner, results

    runner, results = run(main())
    assert sorted(runner.batches) == [(0.5, 1), (1.0, 3)]
    assert results[0].probabilities[:, 0].tolist() == [1.0]
    assert results[1].probabilities[:, 0].tolist() == [2.0, 3.0]
    assert results[2].budget == 0.5 and results[1].batch_size == 3


def test_batches_never_exceed_the_batch_size_unless_one_request_is_larger():
    async def main():
        runner = FakeRunner()
        batcher = make(runner, max_wait_ms=30.0, max_batch_size=2, max_texts=4, max_queue=16)
        batcher.start()
        await asyncio.gather(*(batcher.submit([[i]], 1.0, None) for i in range(5)), batcher.submit([[1]] * 4, 1.0, None))
        await batcher.drain()
        return runner

    sizes = sorted(n for _, n in run(main()).batches)
    assert sum(sizes) == 9 and sizes[-1] == 4 and all(n <= 2 for n in sizes[:-1])


def test_slo_policy_lowers_the_budget_when_the_backlog_would_miss_its_deadlines():
    async def main(n_requests):
        runner = FakeRunner({0.5: 2.0, 1.0: 8.0})
        batcher = make(runner, max_wait_ms=0.0, max_batch_size=1, target_p95_ms=60.0, shed_expired=False)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([[i]], None, None) for i in range(n_requests)))
        await batcher.drain()
        return [r.budget for r in results]

    assert run(main(1)) == [1.0]  # alone: 8 ms fits 60 ms
    budgets = run(main(12))  # 12 x 8 ms = 96 ms > 60 ms: the policy must go lower for some
    assert 0.5 in budgets


def test_a_full_queue_refuses_with_a_retry_after():
    async def main():
        runner = FakeRunner({0.5: 20.0, 1.0: 20.0})
        batcher = make(runner, max_wait_ms=0.0, max_batch_size=1, max_texts=2, max_queue=2)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit([[1], [2]], 1.0, None))
        await asyncio.sleep(0)  # admitted: the queue now holds 2 texts
        with pytest.raises(Overloaded, match="queue full") as info:
            await batcher.submit([[3]], 1.0, None)
        await first
        await batcher.drain()
        return info.value

    assert run(main()).retry_after >= 1


def test_a_request_whose_deadline_passed_in_the_queue_is_dropped():
    async def main():
        runner = FakeRunner({0.5: 50.0, 1.0: 50.0})
        batcher = make(runner, max_wait_ms=0.0, max_batch_size=1)
        batcher.start()
        slow = asyncio.ensure_future(batcher.submit([[1]], 1.0, None))
        await asyncio.sleep(0.005)
        with pytest.raises(DeadlineExpired):
            await batcher.submit([[2]], None, 10.0)  # waits ~50 ms behind the first
        await slow
        await batcher.drain()

    run(main())


def test_drain_finishes_queued_requests_and_then_refuses():
    async def main():
        runner = FakeRunner()
        batcher = make(runner, max_wait_ms=0.0, max_batch_size=1)
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit([[i]], 1.0, None)) for i in range(3)]
        await asyncio.sleep(0)
        await batcher.drain()
        assert all(p.done() and not p.exception() for p in pending)
        with pytest.raises(Overloaded, match="shutting down"):
            await batcher.submit([[9]], 1.0, None)

    run(main())


def test_a_failing_model_call_reaches_every_request_of_the_batch_and_the_worker_lives_on():
    class Failing(FakeRunner):
        def run(self, ids, budget):
            if budget == 0.5:
                raise RuntimeError("boom")
            return super().run(ids, budget)

    async def main():
        batcher = make(Failing(), max_wait_ms=0.0)
        batcher.start()
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.submit([[1]], 0.5, None)
        result = await batcher.submit([[7]], 1.0, None)
        await batcher.drain()
        return result

    assert run(main()).probabilities[0, 0] == 7.0


def test_backlog_groups_by_kind_like_the_worker():
    runner = FakeRunner()
    batcher = make(runner, max_batch_size=2)
    loop = asyncio.new_event_loop()
    try:
        from budgeted_attention.serving.batcher import SLO, Job

        for key in (SLO, 1.0, SLO, 1.0, SLO):
            batcher.queue.append(Job([[1, 2]], key, 50.0 if key == SLO else float("inf"), 0.0, loop.create_future()))
        backlog = batcher._backlog()
    finally:
        loop.close()
    assert [(n, fixed) for n, _, _, fixed in backlog] == [(2, None), (2, 1.0), (1, None)]


def test_a_bookkeeping_error_fails_the_batch_not_the_worker():
    class Broken:
        calls = 0

        def batch(self, budget, n_texts, seconds):
            Broken.calls += 1
            if Broken.calls == 1:
                raise RuntimeError("metrics broke")

        def shed(self, reason, n=1):
            pass

        def queue(self, n_texts):
            pass

    async def main():
        runner = FakeRunner()
        cfg = ServeConfig(budgets=BUDGETS, min_budget=0.5, max_wait_ms=0.0)
        batcher = Batcher(runner, cfg, latency_model(runner), floor=0.5, observer=Broken())
        batcher.start()
        with pytest.raises(RuntimeError, match="metrics broke"):
            await batcher.submit([[1]], 1.0, None)
        result = await batcher.submit([[5]], 1.0, None)
        await batcher.drain()
        return result

    assert run(main()).probabilities[0, 0] == 5.0


def test_the_forecast_is_the_arrival_rate_of_the_last_window():
    async def main():
        batcher = make(FakeRunner(), arrival_window_ms=100.0, max_batch_size=8)
        loop = asyncio.get_running_loop()
        jobs = []
        for arrival, texts in [(0.0, 3), (950.0, 2), (990.0, 5)]:  # only the last two fall in the window at 1000 ms
            batcher._recent.append((arrival, texts))
            jobs.append(Job([[1, 2, 3]] * texts, "slo", arrival + 40.0, arrival, loop.create_future()))
        forecast = batcher._forecast(jobs[1:], clock=1000.0)
        off = make(FakeRunner(), arrival_window_ms=0.0)._forecast(jobs, clock=1000.0)
        return forecast, off

    forecast, off = run(main())
    assert forecast.rate_per_ms == pytest.approx(7 / 100.0)
    assert forecast.latency_ms == pytest.approx(40.0) and forecast.n_tokens == 3 and forecast.max_batch == 8
    assert off is None


def test_arrival_window_must_not_be_negative():
    from budgeted_attention.errors import ConfigError

    with pytest.raises(ConfigError, match="serve.arrival_window_ms"):
        ServeConfig(arrival_window_ms=-1.0)


def test_the_arrival_record_stays_bounded_without_policy_batches():
    for memory, bound in ((0.0, 11), (4000.0, 401)):  # the window, or the memory when longer
        batcher = make(FakeRunner(), arrival_window_ms=100.0, arrival_memory_ms=memory)
        for arrival in range(0, 10_000, 10):  # fixed-budget traffic only: _forecast never runs
            batcher._note_arrival(float(arrival), 1)
        assert len(batcher._recent) <= bound
    off = make(FakeRunner(), arrival_window_ms=0.0)
    off._note_arrival(0.0, 1)
    assert len(off._recent) == 0


def test_with_a_memory_the_forecast_keeps_the_recent_peak_through_a_pause():
    async def main():
        loop = asyncio.get_running_loop()
        job = Job([[1, 2, 3]], "slo", 1540.0, 1500.0, loop.create_future())
        results = {}
        for memory in (0.0, 2000.0):
            batcher = make(FakeRunner(), arrival_window_ms=100.0, arrival_memory_ms=memory)
            for arrival in range(0, 1000, 10):  # a 1 s burst of 1 text per 10 ms (10 per window), then a pause
                batcher._note_arrival(float(arrival), 1)
            batcher._note_arrival(1500.0, 1)  # the next burst's first request
            results[memory] = batcher._forecast([job], clock=1500.0).rate_per_ms
        return results

    rates = run(main())
    assert rates[0.0] == pytest.approx(1 / 100.0)  # the last window only: the pause looks idle
    assert rates[2000.0] == pytest.approx(11 / 100.0)  # the burst's peak window (10 ms steps, ends inclusive)
    with pytest.raises(Exception, match="serve.arrival_memory_ms"):
        ServeConfig(arrival_memory_ms=-1.0)


def _queued(batcher, deadlines_from_now, n_tokens=4, client_deadline=True):
    """Put policy jobs straight into the queue (no worker): one text of the calibration length each
    (so a batch of k takes k x the per-text time), deadlines in ms from now; returns the event loop
    of their futures and that "now" (pass it on: the tests must not depend on how fast they run)."""
    loop = asyncio.new_event_loop()
    clock = now_ms()
    for i, due in enumerate(deadlines_from_now):
        job = Job([[i] * n_tokens], SLO, clock + due, clock, loop.create_future(), client_deadline=client_deadline)
        batcher.queue.append(job)
        batcher.queued_texts += 1
    return loop, clock


def test_deadline_batching_cuts_a_batch_to_the_requests_that_finish_in_time():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})  # 10 ms per text at the floor
    batcher = make(runner, max_batch_size=8, deadline_batching=True)
    loop, clock = _queued(batcher, [45.0, 60.0, 80.0, 90.0, 95.0, 200.0])
    batch = batcher._take_batch(clock)
    # 4 texts take 40 ms and meet the first deadline (45 ms); a fifth would end at 50 ms.
    assert [job.ids[0][0] for job in batch] == [0, 1, 2, 3]
    assert len(batcher.queue) == 2 and batcher.queued_texts == 2
    loop.close()


def test_without_deadline_batching_the_batch_is_full():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    batcher = make(runner, max_batch_size=8, deadline_batching=False)
    loop, clock = _queued(batcher, [45.0, 60.0, 80.0, 90.0, 95.0, 200.0])
    assert len(batcher._take_batch(clock)) == 6
    loop.close()


def test_deadline_batching_keeps_the_whole_batch_when_no_request_can_be_in_time():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    batcher = make(runner, max_batch_size=8, deadline_batching=True, shed_expired=False)
    loop, clock = _queued(batcher, [5.0, 6.0, 8.0])  # each needs 10 ms alone at the floor
    assert len(batcher._take_batch(clock)) == 3
    loop.close()


def test_a_late_request_at_the_front_does_not_decide_the_cut():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    batcher = make(runner, max_batch_size=8, deadline_batching=True, shed_expired=False)
    loop, clock = _queued(batcher, [5.0, 45.0, 60.0, 80.0, 90.0])
    # The first is late whatever happens; the cut follows the others: 4 texts (40 ms) meet 45 ms.
    assert [job.ids[0][0] for job in batcher._take_batch(clock)] == [0, 1, 2, 3]
    loop.close()


def test_deadline_batching_drops_a_request_that_cannot_finish_even_alone():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    batcher = make(runner, max_batch_size=8, deadline_batching=True)
    loop, clock = _queued(batcher, [5.0, 60.0])  # the first needs 10 ms at the floor and has 5
    batcher._shed_expired(clock)
    assert len(batcher.queue) == 1 and batcher.queued_texts == 1
    first = batcher.queue[0]
    assert first.deadline_ms - first.arrival_ms == pytest.approx(60.0)
    loop.close()


def test_the_servers_own_target_is_never_judged_unreachable():
    # A request without latency_ms has the server's target as its deadline: it is answered late
    # rather than refused on an idle server (it is still dropped once that deadline has passed).
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    batcher = make(runner, max_batch_size=8, deadline_batching=True)
    loop, clock = _queued(batcher, [5.0], client_deadline=False)
    batcher._shed_expired(clock)
    assert len(batcher.queue) == 1
    loop.close()


def test_a_request_too_close_to_its_deadline_gets_503_naming_why():
    async def main():
        runner = FakeRunner({0.5: 60.0, 1.0: 60.0})
        batcher = make(runner, max_wait_ms=0.0, max_batch_size=1, deadline_batching=True)
        batcher.start()
        slow = asyncio.ensure_future(batcher.submit([[1]], 1.0, None))
        await asyncio.sleep(0.005)
        with pytest.raises(DeadlineExpired, match="too close to answer in time"):
            # ~45 ms left once the first batch (60 ms) ends, and the floor takes 60: unreachable
            # unless the worker is more than 40 ms late (then the deadline has passed instead).
            await batcher.submit([[2] * 4], None, 100.0)
        await slow
        await batcher.drain()

    run(main())


class RecordingObserver:
    def __init__(self):
        self.shed_reasons = []

    def batch(self, budget, n_texts, seconds):
        pass

    def shed(self, reason, n=1):
        self.shed_reasons.append((reason, n))

    def queue(self, n_texts):
        pass


def test_passed_and_unreachable_deadlines_are_counted_apart():
    runner = FakeRunner({0.5: 10.0, 1.0: 20.0})
    observer = RecordingObserver()
    cfg = ServeConfig(budgets=BUDGETS, min_budget=0.5, max_batch_size=8)
    batcher = Batcher(runner, cfg, latency_model(runner), floor=0.5, observer=observer)
    loop, clock = _queued(batcher, [-1.0, 5.0, 60.0])  # passed; unreachable (needs 10 ms); in time
    passed, unreachable, in_time = list(batcher.queue)
    batcher._shed_expired(clock)
    assert observer.shed_reasons == [("deadline_expired", 1), ("deadline_unreachable", 1)]
    assert list(batcher.queue) == [in_time] and batcher.queued_texts == 1
    assert "deadline passed" in str(passed.future.exception())
    assert "too close to answer in time" in str(unreachable.future.exception())
    assert not in_time.future.done()
    loop.close()
