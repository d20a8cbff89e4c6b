"""Run directories: resolved config, seed(s), package versions, command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from budgeted_attention.io import environment_info, write_json_atomic, write_yaml_atomic


def init_run_dir(out_dir: str | Path, resolved_config: dict[str, Any], seeds: list[int]) -> Path:
    """Create ``out_dir`` and record config.yaml and run_info.json (seeds, versions, command)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_yaml_atomic(out / "config.yaml", resolved_config)
    write_json_atomic(
        out / "run_info.json",
        {
            "seeds": seeds,
            "command": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "environment": environment_info(),
        },
    )
    return out
