"""Interleaved latency measurement with ``torch.utils.benchmark``.

Timing on a shared CPU is noisy, so every model of a comparison is timed in the same process,
round-robin (the order rotates each round), after warm-up, with a fixed thread count; the
reported latency is the median over rounds of each round's median. Freed heap memory stays in the
process while timing (:mod:`~budgeted_attention.benchmark.allocator`), so a model with larger
activations does not pay page faults the others do not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.utils.benchmark as benchmark

from budgeted_attention.benchmark.allocator import keep_freed_memory


def measure_interleaved(
    functions: dict[str, Callable[[], object]],
    *,
    threads: int = 1,
    rounds: int = 5,
    min_run_time: float = 0.2,
    warmup: int = 3,
) -> dict[str, float]:
    """Median latency in milliseconds of each zero-argument callable.

    Args:
        functions: name -> callable running one forward pass.
        threads: torch intra-op threads during timing (restored afterwards).
        rounds: interleaved rounds; each round times every function once.
        min_run_time: seconds per ``blocked_autorange`` call.
        warmup: untimed calls per function before the first round.
    """
    keep_freed_memory()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for fn in functions.values():
                for _ in range(warmup):
                    fn()
            timers = {
                name: benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
                for name, fn in functions.items()
            }
            samples: dict[str, list[float]] = {name: [] for name in functions}
            names = list(functions)
            for round_index in range(rounds):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    measurement = timers[name].blocked_autorange(min_run_time=min_run_time)
                    samples[name].append(measurement.median * 1e3)
    finally:
        torch.set_num_threads(previous_threads)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_interleaved_cuda(
    functions: dict[str, Callable[[], object]],
    *,
    rounds: int = 5,
    iterations: int = 20,
    warmup: int = 5,
) -> dict[str, float]:
    """Median milliseconds per call on the current CUDA device, timed with CUDA events.

    Each round times every function once (``iterations`` back-to-back calls between two events,
    order rotating per round), after ``warmup`` untimed calls each; the GPU is synchronised
    around every measurement, so launch overhead counts, as it does for a served request.
    """
    with torch.inference_mode():
        for fn in functions.values():
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize()
        samples: dict[str, list[float]] = {name: [] for name in functions}
        names = list(functions)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iterations):
                    functions[name]()
                end.record()
                torch.cuda.synchronize()
                samples[name].append(start.elapsed_time(end) / iterations)
    return {name: statistics.median(values) for name, values in samples.items()}


def cuda_graph(fn: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
    """``fn`` (fixed inputs) captured in a CUDA graph; returns the replay (one launch per call)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return graph.replay


def time_call(fn: Callable[[], object], *, repeats: int = 200) -> float:
    """Median wall time of ``fn()`` in milliseconds (for sub-millisecond operations)."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return timer.timeit(repeats).median * 1e3
