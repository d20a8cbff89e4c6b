"""Run directories: kept for the callers not yet switched to :class:`budgeted_attention.rundir.RunDir`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from budgeted_attention.rundir import RunDir


def init_run_dir(out_dir: str | Path, resolved_config: dict[str, Any], seeds: list[int]) -> Path:
    """:meth:`RunDir.create`; returns the folder."""
    return RunDir.create(out_dir, resolved_config, seeds).path
