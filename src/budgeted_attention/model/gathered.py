"""Weights gathered for one head set, reused while the weights they came from are unchanged.

A per-input router runs a different head set for each input. Computing only the selected heads
means gathering their projection rows (``index_select``, a copy) on every call; on a small
model at batch 1 that copy, a few dozen microseconds per layer, is a large part of what the
removed heads saved. Inputs repeat head sets (a layer of 8 heads has 255 possible sets, and a
trained scorer uses far fewer), so :class:`GatherCache` keeps the gathered tensors per set.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

DEFAULT_MAX_BYTES = 16 * 2**20  # per attention module: MiniLM's largest set is 1.8 MiB


class GatherCache:
    """Least-recently-used cache of gathered weight tensors, keyed by head set.

    An entry is valid while every source tensor is the same object at the same version: an
    optimiser step, ``load_state_dict`` or any in-place edit bumps the version, and surgery
    replaces the tensor, so a stale entry is never returned. Exception: an edit through
    ``param.data`` (its own version counter) is not seen; call :meth:`clear` after one. Only for
    calls without autograd: in training the gathered copies must carry gradients to the weights.
    Inference tensors (a model built under ``torch.inference_mode()``) have no version counter:
    for them nothing is cached.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, ...]] = OrderedDict()
        self._bytes = 0
        self._stamp: tuple[tuple[int, int, int], ...] = ()
        self.hits = self.misses = 0

    def get(
        self, heads: tuple[int, ...], sources: tuple[torch.Tensor, ...], gather: Callable[[], tuple[torch.Tensor, ...]]
    ) -> tuple[torch.Tensor, ...]:
        """The tensors ``gather()`` returns for ``heads``, from the cache when ``sources`` are unchanged."""
        entry = self.lookup(heads, sources)
        if entry is None:
            entry = gather()
            self.put(heads, sources, entry)
        return entry

    def lookup(self, heads: tuple[int, ...], sources: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        """The cached tensors of ``heads`` (a hit), or None (a miss); a change of ``sources``
        since the last call empties the cache first."""
        if any(t.is_inference() for t in sources):
            return None
        stamp = tuple((id(t), t.data_ptr(), t._version) for t in sources)
        if stamp != self._stamp:
            self.clear()
            self._stamp = stamp
        entry = self._entries.get(heads)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(heads)
        return entry

    def room_for(self, nbytes: int) -> bool:
        """True when an entry of ``nbytes`` fits without evicting another."""
        return self._bytes + nbytes <= self.max_bytes

    def put(self, heads: tuple[int, ...], sources: tuple[torch.Tensor, ...], entry: tuple[torch.Tensor, ...]) -> None:
        """Keep ``entry`` for ``heads`` (gathered from ``sources`` as :meth:`lookup` last saw
        them), evicting the least recently used entries beyond ``max_bytes``."""
        if any(t.is_inference() for t in sources):
            return
        size = sum(t.numel() * t.element_size() for t in entry)
        if size <= self.max_bytes:
            self._entries[heads] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= sum(t.numel() * t.element_size() for t in dropped)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __deepcopy__(self, memo: dict) -> GatherCache:  # a copied model starts with an empty cache
        return GatherCache(self.max_bytes)

