"""Pruning stage: nested hard head selection, structural surgery, instant budget switching."""

from budgeted_attention.pruning.selection import Ranking

__all__ = ["Ranking"]
