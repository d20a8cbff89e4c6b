"""File helpers: atomic writes, run-directory metadata, JSON/YAML round trips."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml


# False in the non-zero ranks of a torchrun job: rank 0 alone writes (training/distributed.py).
_WRITES_ENABLED = True


def set_writes_enabled(enabled: bool) -> None:
    """Let this process write files (True) or discard every :func:`atomic_path` write (False)."""
    global _WRITES_ENABLED
    _WRITES_ENABLED = bool(enabled)


def writes_enabled() -> bool:
    return _WRITES_ENABLED


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it over ``path``.

    A crash or an exception leaves any previous file at ``path`` untouched and removes the
    temporary file, so readers never see a half-written artefact. In a process whose writes are
    disabled (a non-zero torchrun rank) the temporary file lives in a scratch directory and is
    discarded: the caller's code runs unchanged, nothing reaches ``path``.
    """
    if not _WRITES_ENABLED:
        with tempfile.TemporaryDirectory(prefix="baa-discarded-") as scratch:
            yield Path(scratch) / Path(path).name
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The writer's PID in the name: a temporary file left by a killed writer (SIGKILL runs no
    # ``finally``) is told apart from a live writer's by :func:`remove_stale_temp_files`.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.p{os.getpid()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a process of another user counts as running)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False  # os.kill(0, ...) and negative ids address process groups, not a process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


# ``.NAME.p<PID>.<8 random>.tmp`` (atomic_path), and the PID-less ``.NAME.<8 random>.tmp`` of older code.
_TEMP_WITH_PID = re.compile(r"^\..+\.p(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$")
_TEMP_WITHOUT_PID = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def remove_stale_temp_files(directory: str | os.PathLike[str], log=None, *, min_age_s: float = 900.0) -> list[Path]:
    """Remove the temporary files of :func:`atomic_path` that killed writers left under ``directory``.

    A name with a writer PID is removed when that process no longer runs on this host; a name
    from older code (no PID) when it was not modified for ``min_age_s`` seconds (a live writer
    keeps touching its file). Symbolic links are neither followed nor removed. Call it while
    holding the directory's run lock (:mod:`budgeted_attention.runlock`), so no other writer of
    the run shares the directory. ``log``: called with one line per removed file. Returns the
    removed paths; files that vanish or cannot be removed meanwhile are skipped.
    """
    removed: list[Path] = []
    now = time.time()
    for folder, _, files in os.walk(directory, followlinks=False):
        for name in files:
            path = Path(folder) / name
            match = _TEMP_WITH_PID.match(name)
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                if match is not None:
                    if pid_alive(int(match["pid"])):
                        continue
                elif not _TEMP_WITHOUT_PID.match(name) or now - path.stat().st_mtime < min_age_s:
                    continue
                path.unlink()
            except OSError:
                continue
            removed.append(path)
            if log is not None:
                log(f"removed '{path}', the temporary file of an interrupted write")
    return removed


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_yaml_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as YAML atomically."""
    write_text_atomic(path, yaml.safe_dump(obj, sort_keys=False))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_TRACKED_PACKAGES = (
    "budgeted_attention",
    "torch",
    "numpy",
    "safetensors",
    "tokenizers",
    "transformers",
    "PyYAML",
    "tqdm",
    "matplotlib",
)


def _git(args: list[str], cwd: Path, timeout: float) -> str | None:
    """stdout of ``git ARGS`` in ``cwd``, or None when git is missing, fails or times out."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return result.stdout if result.returncode == 0 else None


def source_provenance(package_dir: str | os.PathLike[str] | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the git checkout holding the package.

    The package's own files must be tracked by that checkout (a package installed into a virtual
    environment that happens to lie inside some repository gets None, not that repository's
    commit). ``dirty`` is whether ``git status --porcelain`` lists anything. Never raises.
    """
    where = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parent
    unknown: dict[str, Any] = {"commit": None, "dirty": None}
    if not where.is_dir():
        return unknown
    commit = _git(["rev-parse", "--verify", "HEAD"], where, timeout)
    if not commit or _git(["ls-files", "--error-unmatch", "--", "."], where, timeout) is None:
        return unknown
    status = _git(["status", "--porcelain"], where, timeout)
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), e.g. 'Intel(R) Xeon(R) Processor'; timings depend on it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def environment_info() -> dict[str, Any]:
    """Package versions, platform facts and source provenance recorded in every run directory.

    ``commit`` / ``dirty``: git commit of the package's source checkout and whether it had
    uncommitted changes (both None outside a git checkout or without git).
    """
    from budgeted_attention import __version__  # noqa: PLC0415 - the package's own version, not its install's metadata

    versions: dict[str, str | None] = {}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # An editable install keeps the metadata of the version it was installed at; the source says
    # which version ran.
    versions["budgeted_attention"] = __version__
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or _cpu_model() or platform.machine(),
        "cpu_count": os.cpu_count(),
        # which machine, without naming it: runs of one host replicate nothing across machines
        "host": hashlib.sha256(platform.node().encode()).hexdigest()[:12] if platform.node() else None,
        "packages": versions,
        **source_provenance(),
    }
