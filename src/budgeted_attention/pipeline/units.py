"""Units: the resumable pieces of a run, each with a typed identity.

A unit's :attr:`UnitId.name` is the stem of its record ``units/seed<N>/<name>.json`` and, for a
unit that trains a model, of its checkpoint ``checkpoints/seed<N>/<name>``: the names run
directories of older code were written with, so they resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from budgeted_attention.pipeline.context import RunContext
    from budgeted_attention.pipeline.outputs import Collected

# The key of a finished-unit record holding the config digest without seeds
# (:func:`~budgeted_attention.pipeline.config.unit_config_digest`); absent from records of older code.
UNIT_DIGEST_KEY = "config_sha256_except_seeds"


@dataclass(frozen=True)
class UnitId:
    """Which unit: ``kind`` (a method's stage or timing, e.g. ``budgeted-hard``, ``bench-static``)
    of ``seed``; ``budget`` for a per-budget unit, ``index`` for a per-shape one (the ladder);
    ``variant`` a suffix naming a training variant (``-sandwich``)."""

    kind: str
    seed: int
    budget: float | None = None
    index: int | None = None
    variant: str = ""

    @property
    def name(self) -> str:
        """File stem: ``<kind><variant>[-b<budget>][-<index>]``, e.g. ``static-b0.5``, ``ladder-0``."""
        budget = "" if self.budget is None else f"-b{self.budget}"
        index = "" if self.index is None else f"-{self.index}"
        return f"{self.kind}{self.variant}{budget}{index}"

    def __str__(self) -> str:
        return f"seed{self.seed}/{self.name}"


def collect_rows(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
    """A unit's contribution to the outputs when it has nothing but rows."""
    collected.add_rows(unit, record)


@dataclass(frozen=True)
class Unit:
    """One entry of a run's plan.

    Attributes:
        id: its identity.
        work: ``work(context, id)`` does the unit and returns its record (``rows``, a list of
            :class:`~budgeted_attention.reporting.rows.ResultRow` or dicts, and extras); run once,
            the record is kept and read back on a resume.
        collect: ``collect(context, collected, id, record)``: the record's contribution to the outputs.
        timing: the unit only measures speed: run on rank 0 alone, and again by ``--retime``.
        seeded: its position counts towards the seed index of later units. False for the timing
            units split off from training units after runs were published, so every other unit
            kept the seed it had before the split.
    """

    id: UnitId
    work: Callable[[RunContext, UnitId], dict[str, Any]]
    collect: Callable[[RunContext, Collected, UnitId, dict[str, Any]], None] = collect_rows
    timing: bool = False
    seeded: bool = True
