"""Run directories: resolved config, seed(s), package versions, command line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from budgeted_attention.io import environment_info, write_json_atomic, write_yaml_atomic


def init_run_dir(out_dir: str | Path, resolved_config: dict[str, Any], seeds: list[int]) -> Path:
    """Create ``out_dir`` and record config.yaml and run_info.json (seeds, versions, commands).

    A resumed run keeps its earlier invocations and appends the new one (command, start time,
    commit and dirty flag) to ``invocations``; ``environment`` is the latest invocation's.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_yaml_atomic(out / "config.yaml", resolved_config)
    environment = environment_info()
    # Each invocation's own commit: a resumed run's units may come from different code.
    invocation = {
        "command": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": environment.get("commit"), "dirty": environment.get("dirty"),
    }
    info_path = out / "run_info.json"
    previous: list[dict[str, Any]] = []
    if info_path.exists():
        try:
            previous = json.loads(info_path.read_text()).get("invocations", [])
        except (json.JSONDecodeError, AttributeError):
            previous = []
    write_json_atomic(
        info_path,
        {"seeds": seeds, "environment": environment, "invocations": [*previous, invocation]},
    )
    return out
