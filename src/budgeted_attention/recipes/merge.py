"""Merge experiment runs that differ only in their seeds into one run directory.

Seeds are independent units of work, so they can be trained in separate processes or on separate
machines (``baa experiment ... --set 'seeds=[3]' --out runs/part3``) and merged afterwards:

    baa merge runs/part0 runs/part3 --out runs/merged
    baa experiment runs/merged/config.yaml --out runs/merged --retime   # time again, alone

The parts must hold the same resolved configuration except ``seeds`` (same data split, model,
schedules, methods) and the same tokenizer; their seeds must not overlap. The merged directory
gets every part's ``units/seed<N>`` and ``checkpoints/seed<N>``, a config with the union of the
seeds, and a ``run_info.json`` whose invocations are every part's (each marked with its part)
followed by the merge itself; its outputs (results, summary, figures) are then written from the
finished units, exactly as a resumed run writes them.

A seed trained alone is not bit-identical to the same seed inside a multi-seed run (a unit's
random seed is ``1000 * seed + its position in the plan``, and a multi-seed plan lists the earlier
seeds' units first); each part reproduces from its own command, which the merged run records.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from budgeted_attention.errors import ConfigError
from budgeted_attention.io import write_json_atomic, write_yaml_atomic

# Written once per run from the data (identical in parts with the same config); copied from the first part.
SHARED_FILES = ("tokenizer.json", "labels.json", "lengths.json")


def _read_part(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved config, run_info) of one part, with a clear error for anything missing or malformed."""
    if not path.is_dir():
        raise ConfigError(f"run directory '{path}' does not exist")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        info = json.loads((path / "run_info.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"'{path}' is not a run directory of 'baa experiment' ({Path(exc.filename).name} is missing)") from None
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"'{path}' holds a malformed config.yaml or run_info.json ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("seeds"), list) or not isinstance(info, dict):
        raise ConfigError(f"'{path}' is not a run directory of 'baa experiment' (config.yaml has no seeds list)")
    return config, info


def _check_compatible(parts: list[Path], configs: list[dict[str, Any]]) -> list[int]:
    """The union of the parts' seeds, sorted; refuses parts whose configs differ beyond the seeds,
    overlapping seeds, different tokenizers, or a part missing a seed's units."""
    first = {k: v for k, v in configs[0].items() if k != "seeds"}
    seen: dict[int, Path] = {}
    for part, config in zip(parts, configs, strict=True):
        other = {k: v for k, v in config.items() if k != "seeds"}
        if other != first:
            keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ConfigError(f"'{part}' and '{parts[0]}' differ in more than their seeds (config keys: {', '.join(keys)}); only seeds may differ")
        for seed in config["seeds"]:
            if seed in seen:
                raise ConfigError(f"seed {seed} is in both '{seen[seed]}' and '{part}'; each seed must come from one part")
            if not (part / "units" / f"seed{seed}").is_dir():
                raise ConfigError(f"'{part}' lists seed {seed} but has no units/seed{seed}: run it (or resume it) before merging")
            seen[seed] = part
        for name in SHARED_FILES:
            mine, theirs = part / name, parts[0] / name
            if mine.is_file() != theirs.is_file() or (mine.is_file() and mine.read_bytes() != theirs.read_bytes()):
                raise ConfigError(f"'{part}' and '{parts[0]}' differ in {name}; parts must come from the same data and code")
    return sorted(seen)


def merge_runs(parts: list[str | Path], out: str | Path) -> tuple[Path, list[int]]:
    """Copy the parts' per-seed units and checkpoints into ``out`` (a new directory) with the merged
    config and provenance; returns (``out``, merged seeds). Outputs are written by the caller
    (:func:`run_merged`). Built in a temporary sibling and renamed, so a failed merge leaves nothing."""
    paths = [Path(p) for p in parts]
    if len(paths) < 2:
        raise ConfigError("merge needs at least two run directories")
    target = Path(out)
    if target.exists():
        raise ConfigError(f"--out '{target}' already exists; merge into a new directory")
    if any(target.resolve() == p.resolve() for p in paths):
        raise ConfigError(f"--out '{target}' is one of the parts")
    read = [_read_part(p) for p in paths]
    configs = [config for config, _ in read]
    seeds = _check_compatible(paths, configs)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in SHARED_FILES:
            if (paths[0] / name).is_file():
                shutil.copy2(paths[0] / name, staging / name)
        invocations: list[dict[str, Any]] = []
        for part, config, (_, info) in zip(paths, configs, read, strict=True):
            for seed in config["seeds"]:
                shutil.copytree(part / "units" / f"seed{seed}", staging / "units" / f"seed{seed}")
                if (part / "checkpoints" / f"seed{seed}").is_dir():
                    shutil.copytree(part / "checkpoints" / f"seed{seed}", staging / "checkpoints" / f"seed{seed}")
            for invocation in info.get("invocations", []):
                if isinstance(invocation, dict):
                    invocations.append({**invocation, "part": str(part)})
        merged = {**configs[0], "seeds": seeds}
        write_yaml_atomic(staging / "config.yaml", merged)
        write_json_atomic(staging / "run_info.json", {"seeds": seeds, "environment": read[0][1].get("environment", {}), "invocations": invocations})
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, seeds


def run_merged(parts: list[str | Path], out: str | Path, progress: bool = True) -> list[int]:
    """:func:`merge_runs`, then the merged run's outputs written from its finished units (nothing
    is trained or timed; ``baa experiment OUT/config.yaml --out OUT --retime`` times it again).
    Returns the merged seeds."""
    from budgeted_attention.recipes.experiment import Experiment, config_from_dict  # noqa: PLC0415
    from budgeted_attention.training import distributed  # noqa: PLC0415

    target, seeds = merge_runs(parts, out)
    config = yaml.safe_load((target / "config.yaml").read_text(encoding="utf-8"))
    cfg = config_from_dict(config)
    with distributed.running("cpu"):
        Experiment(cfg, target, progress=progress).run(finished_only=True)
    return seeds
