"""How the server's processes run: CPU pinning (``serve.engine_cpus``) and the garbage collector
(``serve.freeze_gc``).

CPU pinning.

On a small machine the model's process, the server's event loop and whatever else runs there
(a load generator, a sidecar) compete for the same cores: a forward pass preempted for a few
milliseconds is a request late. Pinning the engine process to CPUs of its own, and the server
process to the others, keeps the model's core free of everything else this server runs.

Linux only (``os.sched_setaffinity``). Affinity is per thread on Linux: every thread of the
process is pinned, and threads started later inherit it from the one that starts them.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

from budgeted_attention.errors import ConfigError

log = logging.getLogger("budgeted_attention.serve")


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def current_cpus() -> set[int]:
    """The CPU ids this process may run on (a container's cpuset or ``taskset`` narrow them)."""
    return set(os.sched_getaffinity(0))


def check_cpus(cpus: list[int], key: str) -> list[int]:
    """``cpus`` if pinning is supported here and this process may run on each of them (else
    ConfigError naming ``key``)."""
    if not cpus:
        return cpus
    if not supported():
        raise ConfigError(f"{key} needs Linux (os.sched_setaffinity), not available on this platform")
    if len(set(cpus)) != len(cpus):
        raise ConfigError(f"{key} lists a CPU twice: {cpus}")
    outside = sorted(set(cpus) - current_cpus())
    if outside:
        raise ConfigError(f"{key}: CPU {outside[0]} is not one this process may run on (allowed: {sorted(current_cpus())})")
    return cpus


def thread_ids() -> list[int]:
    """The kernel ids of this process's threads (just this thread, with a warning, where /proc is missing)."""
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        return [int(name) for name in os.listdir(tasks)]
    log.warning("baa serve: no /proc/self/task; only the calling thread is pinned (threads it starts inherit it)")
    return [0]


def pin_process(cpus: set[int] | list[int]) -> None:
    """Run every thread of this process on ``cpus`` only (threads started later inherit it)."""
    wanted = set(cpus)
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, wanted)
        except ProcessLookupError:  # the thread ended meanwhile
            continue


def server_cpus(engine_cpus: list[int]) -> set[int]:
    """The CPUs the server process keeps when the engine has ``engine_cpus``: the ones it may use
    now without them; all it has when nothing would be left (then they share)."""
    rest = current_cpus() - set(engine_cpus)
    return rest or current_cpus()


def freeze_garbage_collector() -> None:
    """Collect garbage, then exempt every object alive now from later collections (``gc.freeze()``):
    the model, the libraries and the server's own state live as long as the process, and a full
    collection that walks them all stalls every request in flight (``serve.freeze_gc``)."""
    gc.collect()
    gc.freeze()
