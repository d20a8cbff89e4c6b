"""Where training runs: the device, and the process group under ``torchrun``.

One :class:`Runtime` per process, set once by :func:`setup` (the CLI calls it):

* ``--device auto|cpu|cuda``: ``auto`` is CUDA when available, else the CPU; ``cuda`` without a
  GPU is refused with a clear message. Under ``torchrun`` each process uses ``cuda:LOCAL_RANK``.
* ``torchrun --nproc-per-node N -m budgeted_attention.cli experiment CONFIG``: ``WORLD_SIZE`` > 1
  starts a process group (gloo on the CPU, nccl on CUDA). Every training stage then runs its
  steps through :class:`~torch.nn.parallel.DistributedDataParallel`: every rank draws the *same*
  global batch (one shared shuffling generator) and trains on its own contiguous shard of it; the
  budget RNG is seeded identically on every rank, so all ranks gate with the same budget each step;
  DDP averages the gradients, and each rank's loss is scaled by ``world * shard / batch`` so that
  the average is the single-process loss of the global batch (exact for per-example means and for
  terms every rank computes identically, such as the cost penalty; for a language model's
  token-weighted loss it weights shards by examples, not tokens, so it is close but not exact).
  Dropout is seeded per unit, the same on every rank; the logged loss curve is rank 0's shard.
* Rank 0 alone writes files: :func:`budgeted_attention.io.atomic_path` discards other ranks'
  writes (see :func:`budgeted_attention.io.set_writes_enabled`), so checkpoints, unit files,
  results and logs come from one process, and a resumed run reads what rank 0 wrote.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from budgeted_attention.errors import ConfigError
from budgeted_attention.io import set_writes_enabled

DEVICES = ("auto", "cpu", "cuda")
PROCESS_GROUP_TIMEOUT = datetime.timedelta(hours=3)


@dataclass(frozen=True)
class Runtime:
    """Device and process group of this process.

    Attributes:
        device: where models and data live during training.
        rank, world_size: this process's rank and the number of processes (1: no process group).
        bf16: autocast forward passes to bfloat16 (CUDA only).
    """

    device: torch.device = torch.device("cpu")
    rank: int = 0
    world_size: int = 1
    bf16: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        """bfloat16 autocast on CUDA when asked for, else a no-op context."""
        enabled = self.bf16 and self.device.type == "cuda"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)


_RUNTIME = Runtime()


def current() -> Runtime:
    """The runtime set by :func:`setup` (the CPU, one process, by default)."""
    return _RUNTIME


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA if available else CPU; ``cuda`` -> ``cuda:local_rank`` (refused without a GPU)."""
    if name not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' requested but no CUDA GPU is available (torch.cuda.is_available() is False)")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup(device: str = "cpu", bf16: bool = False) -> Runtime:
    """Set this process's runtime from ``device`` and the ``torchrun`` environment
    (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``); starts the process group when ``WORLD_SIZE`` > 1."""
    global _RUNTIME
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if bf16 and resolved.type != "cuda":
        raise ConfigError("--bf16 needs a CUDA device (bfloat16 autocast on the CPU is slower, not faster)")
    if world > 1 and not dist.is_initialized():
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        # Long timeout: the other ranks wait in a barrier while rank 0 alone runs a timing unit.
        dist.init_process_group(backend="nccl" if resolved.type == "cuda" else "gloo", timeout=PROCESS_GROUP_TIMEOUT)
    _RUNTIME = Runtime(resolved, rank, world, bf16)
    set_writes_enabled(rank == 0)
    return _RUNTIME


def use(runtime: Runtime) -> None:
    """Install ``runtime`` directly (tests; processes whose group is already initialised)."""
    global _RUNTIME
    _RUNTIME = runtime
    set_writes_enabled(runtime.is_main)


def teardown(wait: bool = True) -> None:
    """Leave the process group (if any; after a barrier when ``wait``) and return to the
    single-process CPU runtime."""
    global _RUNTIME
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
    _RUNTIME = Runtime()
    set_writes_enabled(True)


@contextlib.contextmanager
def running(device: str = "auto", bf16: bool = False) -> Iterator[Runtime]:
    """:func:`setup` for the duration of a command, then :func:`teardown` (also on errors)."""
    runtime = setup(device, bf16)
    try:
        yield runtime
    except BaseException:
        teardown(wait=False)  # a failed rank must not wait in a barrier the others never reach
        raise
    teardown()


def agree(value: bool) -> bool:
    """Rank 0's ``value`` on every rank (a decision such as "this unit is finished" must be the
    same everywhere, or collectives pair up wrongly); ``value`` itself in one process."""
    if not (_RUNTIME.distributed and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if _RUNTIME.distributed and dist.is_initialized():
        dist.barrier()


def shard(batch: tuple[torch.Tensor, ...], runtime: Runtime) -> tuple[tuple[torch.Tensor, ...], float]:
    """This rank's contiguous share of a global batch and its loss scale ``world * rows / batch``.

    Shards differ by at most one row; a rank whose shard would be empty (a last partial batch with
    fewer rows than ranks) gets the batch's first row with scale 0, so it still joins the gradient
    all-reduce without changing the result.
    """
    rows = batch[0].shape[0]
    if not runtime.distributed:
        return batch, 1.0
    base, extra = divmod(rows, runtime.world_size)
    start = runtime.rank * base + min(runtime.rank, extra)
    count = base + (1 if runtime.rank < extra else 0)
    if count == 0:
        return tuple(t[:1] for t in batch), 0.0
    return tuple(t[start : start + count] for t in batch), runtime.world_size * count / rows
