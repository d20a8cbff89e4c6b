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

What a merge checks and cleans: every part's ``config.sha256`` must be the digest of its
``config.yaml`` (an edited config is refused); a part another process is writing is refused; no
symbolic link is followed (one leading out of the seed folder copied is refused before anything
is copied; links within it are copied as links); each part's ``.lock`` and leftover ``*.tmp``
files are not copied. The staging copy ``.OUT.merging-p<PID>-XXXXXXXX`` beside ``--out`` holds the run lock
while it is built and is removed in ``finally``; staging copies of killed merges (their PID no
longer runs on this host, their lock is free) are removed by the next merge into that folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from budgeted_attention.config import to_dict
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import pid_alive, write_json_atomic, write_yaml_atomic
from budgeted_attention.pipeline import Experiment, ExperimentConfig, config_digest, config_from_dict
from budgeted_attention.rundir import RunDir
from budgeted_attention.runlock import RunDirLock, abandoned, current_holder, describe_holder
from budgeted_attention.training import distributed


def _read_part(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved config, run_info) of one part, with a clear error for anything missing or malformed."""
    run = RunDir.open(path, require=(RunDir.config, RunDir.run_info))
    try:
        config = yaml.safe_load(run.config.read_text(encoding="utf-8"))
        info = json.loads(run.run_info.read_text(encoding="utf-8"))
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())  # YAML errors span several lines
        raise ConfigError(f"'{path}' holds a malformed {RunDir.config.name} or {RunDir.run_info.name} ({reason})") from None
    if not isinstance(config, dict) or not isinstance(config.get("seeds"), list) or not isinstance(info, dict):
        raise ConfigError(f"'{path}' is not a run directory of 'baa experiment' ({RunDir.config.name} has no seeds list)")
    holder = current_holder(path)
    if holder is not None:
        raise ConfigError(f"'{path}' is being written by {describe_holder(holder)}: merge it once that run has finished")
    _check_stamp(path, config)
    return config, info


def _check_stamp(part: Path, config: dict[str, Any]) -> None:
    """Refuse a part whose config is not the one its config digest stamped (edited after the run:
    its units were computed under another config). Its seeds are checked on the way."""
    run = RunDir(part).check(RunDir.config_digest)
    stamped = run.config_digest.read_text(encoding="utf-8").strip()
    actual = config_digest(_parsed(config, part))
    if actual != stamped:
        raise ConfigError(
            f"'{run.config}' is not the config its run was made with: its digest is {actual}, "
            f"'{run.config_digest}' says {stamped} (edited after the run?); restore it or rerun that part"
        )


def _parsed(config: dict[str, Any], part: Path) -> ExperimentConfig:
    """A part's config as the experiment resolves it; an error names the part's config file."""
    try:
        return config_from_dict(config)
    except ConfigError as exc:
        raise ConfigError(f"'{RunDir(part).config}': {exc}") from None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _check_links(part: Path, seeds: list[int]) -> None:
    """Refuse, before anything is copied, a symbolic link among what is copied from ``part`` that
    leads out of the folder copied (a seed's units or checkpoints folder; the part for its data
    files), a link loop such as ``up -> ../..`` included: the copy keeps links as links, and one
    pointing elsewhere would tie the merged run to files it does not hold."""
    part_root = Path(os.path.realpath(part))
    checks: list[tuple[Path, Path, Path]] = [(part / name, part_root, part) for name in RunDir.DATA_FILES]  # (link?, root, root as named)
    for seed in seeds:
        for top in RunDir(part).seed_dirs(seed):
            checks += [(top.parent, part_root, part), (top, part_root, part)]
            if top.is_dir() and not top.is_symlink():
                root = Path(os.path.realpath(top))
                for where, dirs, files in os.walk(top, followlinks=False):
                    checks += [(Path(where) / name, root, top) for name in dirs + files]
    for path, root, shown in checks:
        if path.is_symlink() and not _inside(Path(os.path.realpath(path)), root):
            raise ConfigError(
                f"'{path}' is a symbolic link to '{os.readlink(path)}', outside '{shown}': "
                "a merge copies only what lies inside its parts' seed folders"
            )


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train.lr": 0.001, ...}``: a nested config as dotted keys (lists are values)."""
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _resolved(config: dict[str, Any], part: Path) -> dict[str, Any]:
    """A part's config as the experiment resolves it (defaults filled in, so a part written by
    older code, without a key added since at its default, equals a newer one), seeds and the
    training device left out: where a seed trained is not what it computed."""
    resolved = to_dict(_parsed({**config, "seeds": [0]}, part))
    resolved["train"].pop("device", None)
    resolved.pop("seeds", None)
    return resolved


def _check_compatible(parts: list[Path], configs: list[dict[str, Any]]) -> list[int]:
    """The union of the parts' seeds, sorted; refuses parts whose configs differ beyond the seeds
    (and the training device), overlapping seeds, different tokenizers, or a seed without its
    units or checkpoints. The seeds are integers: :func:`_read_part` checked each part's config."""
    first = _flat(_resolved(configs[0], parts[0]))
    seen: dict[int, Path] = {}
    for part, config in zip(parts, configs, strict=True):
        _check_links(part, config["seeds"])
        other = _flat(_resolved(config, part))
        if other != first:
            keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ConfigError(f"'{part}' and '{parts[0]}' differ in more than their seeds ({', '.join(keys)}); only seeds may differ")
        for seed in config["seeds"]:
            if seed in seen:
                raise ConfigError(f"seed {seed} is in both '{seen[seed]}' and '{part}'; each seed must come from one part")
            for folder in RunDir(part).seed_dirs(seed):
                if not folder.is_dir():
                    raise ConfigError(
                        f"'{part}' lists seed {seed} but has no {folder.relative_to(part)}: finish that run (resume it) before merging"
                    )
            seen[seed] = part
        for name in RunDir.DATA_FILES:
            mine, theirs = part / name, parts[0] / name
            if mine.is_file() != theirs.is_file() or (mine.is_file() and mine.read_bytes() != theirs.read_bytes()):
                raise ConfigError(f"'{part}' and '{parts[0]}' differ in {name}; parts must come from the same data and code")
    return sorted(seen)


def _stage(paths: list[Path], configs: list[dict[str, Any]], infos: list[dict[str, Any]], seeds: list[int], staging: Path) -> None:
    """Copy the parts' seeds and data files into ``staging``; write the merged config and provenance."""
    merged = RunDir(staging)
    for name in RunDir.DATA_FILES:
        if (paths[0] / name).is_file():
            shutil.copy2(paths[0] / name, staging / name)
    invocations: list[dict[str, Any]] = []
    for part, config, info in zip(paths, configs, infos, strict=True):
        for seed in config["seeds"]:
            for source, target in zip(RunDir(part).seed_dirs(seed), merged.seed_dirs(seed), strict=True):
                try:
                    # Links within the part stay links (never followed); a part's lock file and the
                    # temporary files of its interrupted writes are not artifacts.
                    shutil.copytree(source, target, symlinks=True, ignore=_NOT_COPIED)
                except shutil.Error as exc:  # one entry per failed file: report the first, on one line
                    errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
                    first = " ".join(str(errors[0][-1] if errors and isinstance(errors[0], tuple) else exc).split())[:300]
                    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                    raise ConfigError(f"copying '{source}' failed: {first}{more}") from None
        for invocation in info.get("invocations", []):
            if isinstance(invocation, dict):
                # A part that was itself merged keeps its inner parts' tags.
                invocations.append({"part": str(part), **invocation})
    write_yaml_atomic(merged.config, {**configs[0], "seeds": seeds})
    write_json_atomic(merged.run_info, {"seeds": seeds, "environment": infos[0].get("environment", {}), "invocations": invocations})


_NOT_COPIED = shutil.ignore_patterns(RunDir.lock.name, ".*.tmp")

# ``.OUT.merging-p<PID>-XXXXXXXX``: the staging copy of a merge into OUT by process PID.
_STAGING = re.compile(r"^\..+\.merging-p(?P<pid>\d+)-[a-z0-9_]{8}$")


def _remove_stale_staging(folder: Path, log) -> None:
    """Remove the staging copies in ``folder`` that killed merges left (a SIGKILL runs no
    ``finally``): their process no longer runs on this host and their lock is free."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        match = _STAGING.match(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir():
            continue
        if pid_alive(int(match["pid"])) or not abandoned(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)  # rmtree removes links, never what they point to
        log(f"removed '{entry}', the staging copy of a merge that was killed (PID {match['pid']})")


def _new_folder_beside(target: Path) -> Path:
    """An empty staging folder next to ``target`` with the permissions a plain ``mkdir`` gives
    (``mkdtemp`` makes it 0700, and the rename would keep that), named with this process's PID."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.merging-p{os.getpid()}-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    return staging


def run_merged(parts: list[str | Path], out: str | Path, progress: bool = True, log=print) -> list[int]:
    """Merge the parts into ``out`` (a new directory) and write its outputs from the finished units
    (nothing is trained or timed; ``baa experiment OUT/config.yaml --out OUT --retime`` times it
    again). Everything is built in a temporary sibling (locked while it is built) and renamed at
    the end, so a failed merge leaves nothing behind; a merge with missing units is refused.
    Returns the merged seeds."""
    paths = [Path(p) for p in parts]
    if len(paths) < 2:
        raise ConfigError("merge needs at least two run directories")
    target = Path(out)
    if target.exists():
        raise ConfigError(f"--out '{target}' already exists; merge into a new directory")
    read = [_read_part(p) for p in paths]
    configs, infos = [config for config, _ in read], [info for _, info in read]
    seeds = _check_compatible(paths, configs)
    _remove_stale_staging(target.parent, log)
    staging = _new_folder_beside(target)
    try:
        # The Experiment below takes this lock again (same process): no deadlock, and the lock
        # file goes with the last release, before the rename.
        with RunDirLock(staging, log=log):
            _stage(paths, configs, infos, seeds, staging)
            cfg = config_from_dict({**configs[0], "seeds": seeds})
            with distributed.running("cpu"):
                experiment = Experiment(cfg, staging, progress=progress, log=lambda *_: None)
                experiment.run(finished_only=True)
            if experiment.partial:
                raise ConfigError(f"the parts do not hold finished runs: {experiment.partial.removeprefix('PARTIAL RUN: ')}")
        if target.exists():
            raise ConfigError(f"--out '{target}' was created by another process while merging; merge into a new directory")
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log(f"run directory: {target}")
    return seeds
