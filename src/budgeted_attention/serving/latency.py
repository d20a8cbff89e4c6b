"""The server's latency model: how long a batch takes at each budget, measured at start-up and
corrected from live timings; the SLO policy reads it to pick a budget.

A batch of ``n`` texts padded to ``T`` tokens is treated as ``n * T / T_cal`` calibration-length
texts (compute grows about linearly in tokens at these lengths); the calibrated time of that
"effective batch size" is interpolated linearly between the timed batch sizes and multiplied by
one correction shared by every budget: the exponentially weighted mean of observed / predicted
over live batches. Shared, because what drifts (a busier machine, other workers calibrating at
the same time) slows every budget alike, and because a per-budget factor could never recover
for a budget the policy stopped choosing after one pessimistic estimate.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass


class LatencyModel:
    """Predicted milliseconds per batch, per budget.

    Args:
        table: budget -> {batch size: milliseconds} at ``seq_len`` tokens per text.
        seq_len: tokens per text in the calibration.
        smoothing: weight of a new observation in the correction factor (0 = never corrected).
    """

    def __init__(self, table: dict[float, dict[int, float]], seq_len: int, smoothing: float = 0.1) -> None:
        if not table:
            raise ValueError("latency table is empty")
        self.table = {float(b): dict(sorted(sizes.items())) for b, sizes in table.items()}
        self.seq_len = max(1, int(seq_len))
        self.smoothing = smoothing
        self.factor = 1.0  # observed / calibrated, shared by every budget

    @property
    def budgets(self) -> list[float]:
        return sorted(self.table)

    def _base(self, budget: float, effective: float) -> float:
        sizes = list(self.table[budget])
        times = list(self.table[budget].values())
        if len(sizes) == 1:
            return times[0] * effective / sizes[0]
        if effective <= sizes[0]:  # below the smallest timed size: a fixed overhead plus the slope
            slope = (times[1] - times[0]) / (sizes[1] - sizes[0])
            return max(times[0] - slope * (sizes[0] - effective), 0.05 * times[0])
        i = min(bisect.bisect_left(sizes, effective), len(sizes) - 1)
        lo, hi = i - 1, i
        slope = (times[hi] - times[lo]) / (sizes[hi] - sizes[lo])
        return times[lo] + slope * (effective - sizes[lo])  # also extrapolates past the largest size

    def predict_ms(self, budget: float, n_texts: int, n_tokens: int) -> float:
        """Predicted wall time (ms) of one batch of ``n_texts`` texts padded to ``n_tokens`` tokens."""
        effective = n_texts * max(n_tokens, 1) / self.seq_len
        return self._base(budget, effective) * self.factor

    def observe(self, budget: float, n_texts: int, n_tokens: int, milliseconds: float) -> None:
        """Fold one live batch timing into the budget's correction factor."""
        predicted = self.predict_ms(budget, n_texts, n_tokens) / self.factor
        if predicted <= 0 or self.smoothing <= 0:
            return
        ratio = min(max(milliseconds / predicted, 0.2), 5.0)  # one stalled batch must not swing the model
        self.factor = (1 - self.smoothing) * self.factor + self.smoothing * ratio

    def as_dict(self) -> dict[str, object]:
        return {
            "seq_len": self.seq_len,
            "table_ms": {str(b): {str(n): round(ms, 3) for n, ms in sizes.items()} for b, sizes in self.table.items()},
            "correction": round(self.factor, 3),
        }


def calibrate(
    run_batch: Callable[[float, int], float],
    budgets: list[float],
    batch_sizes: list[int],
    *,
    seq_len: int,
    warmup: int = 2,
    repeats: int = 3,
) -> LatencyModel:
    """Time ``run_batch(budget, batch_size)`` (returns seconds) for every pair; median of ``repeats``."""
    table: dict[float, dict[int, float]] = {}
    for budget in budgets:
        table[budget] = {}
        for size in batch_sizes:
            for _ in range(warmup):
                run_batch(budget, size)
            table[budget][size] = statistics.median(run_batch(budget, size) for _ in range(repeats)) * 1e3
    return LatencyModel(monotone(table), seq_len)


def monotone(table: dict[float, dict[int, float]]) -> dict[float, dict[int, float]]:
    """Each cell lowered to the fastest cell that does at least as much work (a budget and batch
    size both at least as large): a noisy slow timing must not make a smaller budget or batch look
    slower than a larger one."""
    return {
        budget: {
            size: min(table[b][n] for b in table if b >= budget for n in table[b] if n >= size)
            for size in sizes
        }
        for budget, sizes in table.items()
    }


@dataclass(frozen=True)
class Arrivals:
    """Requests expected to arrive while the queued batches run (the arrival-aware check of
    :func:`pick_budget`).

    Attributes:
        rate_per_ms: recent arrival rate, texts per millisecond.
        n_tokens: tokens per text to assume for them.
        latency_ms: the latency they will ask for (their deadline after arrival).
        max_batch: texts per batch they will be served in.
    """

    rate_per_ms: float
    n_tokens: int
    latency_ms: float
    max_batch: int


def _arrivals_rescuable(model: LatencyModel, arrivals: Arrivals, start_ms: float, busy_until_ms: float, floor: float) -> bool:
    """Whether the texts arriving from ``start_ms`` while the server is busy until ``busy_until_ms``
    can still be served on time at the floor budget, oldest first, in batches of ``max_batch``."""
    expected = arrivals.rate_per_ms * (busy_until_ms - start_ms)
    clock, served = busy_until_ms, 0.0
    while expected - served >= 0.5:
        size = min(arrivals.max_batch, math.ceil(expected - served))
        clock += model.predict_ms(floor, size, arrivals.n_tokens)
        first_arrival = start_ms + served / arrivals.rate_per_ms  # the oldest text of this batch
        if clock > first_arrival + arrivals.latency_ms:
            return False
        served += size
    return True


def pick_budget(
    model: LatencyModel,
    batches: list[tuple[int, int, float] | tuple[int, int, float, float | None]],
    now_ms: float,
    floor: float,
    arrivals: Arrivals | None = None,
) -> float:
    """The largest budget (not below ``floor``) at which every batch finishes before its deadline.

    Args:
        batches: the batch about to run first, then the backlog behind it, each as
            (n_texts, n_tokens, deadline in ms on the same clock as ``now_ms``; ``inf`` for none)
            and optionally a fixed budget (explicit-budget batches run at their own budget
            whatever the policy picks; None or absent: the candidate budget).
            Counting the backlog is what makes the policy lower the budget under load: a budget
            that serves this batch in time but leaves the queue behind it late is not chosen.
        floor: the smallest budget allowed; returned when no budget meets every deadline.
        arrivals: when given, a budget is also refused if the requests expected to arrive while
            the queued work runs at it could no longer be served on time even at ``floor``: the
            queue alone reacts a batch too late when a burst starts (a large budget chosen on an
            empty queue leaves the burst's first requests waiting behind it).
    """
    for budget in sorted((b for b in model.budgets if b >= floor), reverse=True):
        clock = now_ms
        for n_texts, n_tokens, deadline, *fixed in batches:
            own = fixed[0] if fixed and fixed[0] is not None else budget
            clock += model.predict_ms(own, n_texts, n_tokens)
            if clock > deadline:
                break
        else:
            if budget == floor or arrivals is None or arrivals.rate_per_ms <= 0:
                return budget
            if _arrivals_rescuable(model, arrivals, now_ms, clock, floor):
                return budget
    return floor
