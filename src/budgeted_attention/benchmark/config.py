"""Settings of a latency benchmark (``bench:`` section of a config, ``baa bench`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchConfig:
    """Settings of a latency benchmark (times in seconds).

    Attributes:
        budgets: budgets to prune to and time; empty means "the run's sweep budgets below 1".
        batch_sizes: batch sizes to time.
        seq_lens: padded sequence lengths to time (random ids); empty means "the data's length".
        threads: torch intra-op threads while timing.
        rounds: interleaved timing rounds (median of round medians).
        min_run_time: seconds per ``blocked_autorange`` call.
        include_sliced: also time the sliced layout (instant switching) at each budget.
    """

    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    seq_lens: list[int] = field(default_factory=lambda: [128])
    threads: int = 1
    rounds: int = 5
    min_run_time: float = 0.2
    include_sliced: bool = True
