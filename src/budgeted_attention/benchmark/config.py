"""Settings of a latency benchmark (``bench:`` section of a config, ``baa bench`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from budgeted_attention.config import check_bool, check_budgets, check_float, check_int, check_int_list
from budgeted_attention.errors import ConfigError


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
        include_sliced: also time the budget switch of the sliced layout (instant switching).
        lengths: also time padded batches whose lengths are sampled from the training split's
            real token counts (the latency a user of the data set sees).
        onnx: also export the dense model and every budget's pruned model to ONNX and time them
            with ONNX Runtime (``threads`` intra-op threads) in the same interleaved rounds.
        int8: with ``onnx``, also time each graph's dynamic int8 quantization (dense int8 is the
            Optimum-style peer a user would pick instead).
        device: ``cpu`` (torch.utils.benchmark) or ``cuda`` (CUDA events after warm-up, every
            model and input on the GPU).
        compile: ``torch.compile`` every timed model (each pruned shape compiles once).
        cuda_graphs: capture each timed call in a CUDA graph and time its replay (``cuda`` only).

    Every value is checked on construction (``ConfigError`` naming ``bench.<key>``): budgets
    finite in (0, 1]; batch sizes at least one, all >= 1; sequence lengths >= 1; threads and
    rounds >= 1; min_run_time finite > 0.
    """

    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    seq_lens: list[int] = field(default_factory=lambda: [128])
    threads: int = 1
    rounds: int = 5
    min_run_time: float = 0.2
    include_sliced: bool = True
    lengths: bool = False
    onnx: bool = False
    int8: bool = False
    device: str = "cpu"
    compile: bool = False
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        self.budgets = check_budgets(self.budgets, "bench.budgets", allow_empty=True)
        self.batch_sizes = check_int_list(self.batch_sizes, "bench.batch_sizes", ge=1)
        self.seq_lens = check_int_list(self.seq_lens, "bench.seq_lens", ge=1, allow_empty=True)
        self.threads = check_int(self.threads, "bench.threads", ge=1)
        self.rounds = check_int(self.rounds, "bench.rounds", ge=1)
        self.min_run_time = check_float(self.min_run_time, "bench.min_run_time", gt=0.0)
        check_bool(self.include_sliced, "bench.include_sliced")
        check_bool(self.lengths, "bench.lengths")
        check_bool(self.onnx, "bench.onnx")
        check_bool(self.int8, "bench.int8")
        if self.int8 and not self.onnx:
            raise ConfigError("bench.int8 quantizes the ONNX graphs: it needs bench.onnx (baa bench --onnx --int8)")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"bench.device must be 'cpu' or 'cuda', got {self.device!r}")
        check_bool(self.compile, "bench.compile")
        check_bool(self.cuda_graphs, "bench.cuda_graphs")
        if self.cuda_graphs and self.device != "cuda":
            raise ConfigError("bench.cuda_graphs needs bench.device 'cuda'")
        if self.onnx and self.device != "cpu":
            raise ConfigError("bench.onnx times ONNX Runtime on the CPU; use bench.device 'cpu'")
