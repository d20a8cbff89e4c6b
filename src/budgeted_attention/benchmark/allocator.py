"""Keep freed heap memory in the process while timing, so no model pays page faults another does not.

glibc's malloc serves large blocks (above a threshold that adapts up to 32 MiB) from freshly
mapped pages and hands freed memory at the top of the heap back to the system. A forward pass
with large activations then faults its pages in again on every call. On the d256 encoder at batch
32 and sequence 128 the dense reference took about 33,000 page faults per pass (a fifth of its
time) and the pruned model at b = 0.25, with smaller activations, about 3,700: the measured
speedup was inflated by the allocator, not earned by the pruning. ``mallopt(M_MMAP_THRESHOLD,
32 MiB)`` and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` keep blocks up to 32 MiB in the heap and freed
memory in the process, so after warm-up every model runs from reused pages (the state a server
reaches with jemalloc or tcmalloc). The price is that the process keeps its peak heap.

Set ``BAA_MALLOC_DEFAULT=1`` to time with the allocator's defaults instead.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_BYTES = 1 << 30
MMAP_BYTES = 32 << 20  # the largest M_MMAP_THRESHOLD glibc accepts on 64-bit systems
OPT_OUT = "BAA_MALLOC_DEFAULT"

_setting: str | None = None


def keep_freed_memory() -> str:
    """Configure glibc's malloc as above (once per process) and return what the timings run with.

    Returns:
        A one-line description for the benchmark's record, e.g. ``"glibc 2.36 malloc, freed
        memory kept in the process (M_TRIM_THRESHOLD 1 GiB, M_MMAP_THRESHOLD 32 MiB)"``.
    """
    global _setting
    if _setting is None:
        _setting = _configure()
    return _setting


def _configure() -> str:
    if os.environ.get(OPT_OUT, "") not in ("", "0"):
        return f"the system allocator's defaults ({OPT_OUT} is set)"
    library, version = platform.libc_ver()
    if library != "glibc":
        return "the system allocator's defaults (not glibc)"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has mallopt
        return f"glibc {version} malloc defaults (mallopt not found)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) != 1 or mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) != 1:
        return f"glibc {version} malloc defaults (mallopt refused the settings)"
    return f"glibc {version} malloc, freed memory kept in the process (M_TRIM_THRESHOLD 1 GiB, M_MMAP_THRESHOLD 32 MiB)"
