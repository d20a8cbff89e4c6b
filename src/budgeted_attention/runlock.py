"""Advisory locks on run directories: one writing process per run directory at a time.

A command that writes a run directory (``baa experiment``, ``baa lm``, ``baa demo``, ``--retime``
and the staging copy of ``baa merge``) holds ``fcntl.flock`` on ``RUN_DIR/.lock`` while it writes.
The file records its holder as JSON (``pid``, ``host``, ``started``, ``command``), so a second
writer fails at once with one line naming it (:class:`RunDirLockedError`, exit code 2 in the CLI)
instead of mixing its rows into the first one's.

The kernel drops a ``flock`` when its holder dies, even by SIGKILL; the record stays. A record
whose lock is free and whose process no longer runs on this host is a stale lock: it is taken
over with a log line. A free lock whose recorded process still runs (the PID was reused, or the
file system ignores ``flock``), or was recorded on another host, is refused with a line saying
which file to delete once that process is known to be gone.

A clean release removes the file (and a directory the lock created and nothing else filled), so
a finished run directory holds no ``.lock``. A process may take the lock of a directory it
already holds again (nested writers, e.g. two :class:`~budgeted_attention.pipeline.Experiment`
objects on one run in one process); the file goes at the last release. Processes whose writes
are disabled (the non-zero ranks of a torchrun job, :func:`budgeted_attention.io.set_writes_enabled`)
take no lock: rank 0 writes for them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgeted_attention.errors import ConfigError
from budgeted_attention.io import pid_alive, writes_enabled

LOCK_NAME = ".lock"

# flock errors of file systems without locks: the holder record alone then decides.
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


class RunDirLockedError(ConfigError):
    """Another process writes this run directory (the message names it)."""


@dataclass
class _Held:
    fd: int
    path: Path
    directory: Path
    created: bool  # the lock made the directory: removed at release if nothing else was put there
    count: int = 1


_HELD: dict[str, _Held] = {}  # real path of a run directory -> this process's lock on it
_GUARD = threading.Lock()


def _holder_record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv)[:200],
    }


def _read_record(fd: int) -> dict[str, Any] | None:
    """The holder record in the open lock file: None when empty, ``{}`` when unreadable."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    if not raw.strip():
        return None
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(fd: int) -> None:
    data = (json.dumps(_holder_record()) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.fsync(fd)


def describe_holder(record: dict[str, Any] | None) -> str:
    """``PID 4242 on host box (since 2025-01-01T10:00:00+0000, 'baa demo --quick')``, one line."""
    if record is None:
        return "another process (its record not written yet)"
    if not record:
        return "an unknown process (unreadable lock record)"
    command = str(record.get("command", "")).replace("\n", " ")
    since = f"since {record.get('started', '?')}" + (f", {command!r}" if command else "")
    return f"PID {record.get('pid', '?')} on host {record.get('host', '?')} ({since})"


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the open file (a releasing holder may have removed it)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _check_free_record(directory: Path, path: Path, record: dict[str, Any] | None, log) -> None:
    """The lock is free: take over a stale record (with a log line) or refuse a doubtful one."""
    if record is None:
        return
    pid, host = record.get("pid"), record.get("host")
    if record and host != socket.gethostname():
        raise RunDirLockedError(
            f"'{directory}' was locked by {describe_holder(record)}; this host cannot tell whether that process still runs: "
            f"delete '{path}' once it is known to be gone"
        )
    if record and pid != os.getpid() and pid_alive(pid):
        raise RunDirLockedError(
            f"'{directory}' is locked by {describe_holder(record)}, which still runs although the lock is free "
            f"(a reused PID, or a file system without flock): delete '{path}' once that process is known not to write it"
        )
    log(f"taking over the stale lock of '{directory}': {describe_holder(record)} no longer runs")


def _acquire(directory: Path, log) -> _Held:
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    for _ in range(20):  # retried only when a releasing holder removed the file between open and flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _read_record(fd)
                alive = "" if record is None or pid_alive(record.get("pid")) else "; that process is gone, one it started still holds the lock"
                raise RunDirLockedError(
                    f"'{directory}' is being written by {describe_holder(record)}{alive}: wait for it to finish or use another --out"
                ) from None
            except OSError as exc:
                if exc.errno not in _NO_FLOCK:
                    raise
            if not _same_file(fd, path):
                os.close(fd)
                continue
            _check_free_record(directory, path, _read_record(fd), log)
            _write_record(fd)
            return _Held(fd, path, directory, created)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    raise RunDirLockedError(f"'{directory}' is being locked and released by other processes in quick succession; try again")


def _release(held: _Held) -> None:
    try:
        if _same_file(held.fd, held.path):
            held.path.unlink()  # while still locked: a process that opened it meanwhile sees it gone and retries
        if held.created:
            with contextlib.suppress(OSError):
                held.directory.rmdir()  # only succeeds while empty: a start that failed before writing anything
    except OSError:
        pass  # the directory was removed or renamed meanwhile (a merge's staging copy): nothing left to clean
    finally:
        os.close(held.fd)  # drops the flock


class RunDirLock:
    """This process's hold on the lock of one run directory (see the module docstring).

    ``acquire`` and ``release`` are idempotent per object; the object is a context manager.
    ``log``: called with the one line of a stale-lock takeover.
    """

    def __init__(self, directory: str | os.PathLike[str], log=print) -> None:
        self.directory = Path(directory)
        self.log = log
        self._key: str | None = None

    @property
    def held(self) -> bool:
        return self._key is not None

    def acquire(self) -> RunDirLock:
        """Take the lock (create the directory if needed); :class:`RunDirLockedError` when another process holds it."""
        if self._key is not None or not writes_enabled():
            return self
        key = os.path.realpath(self.directory)
        with _GUARD:
            held = _HELD.get(key)
            if held is not None:
                held.count += 1
            else:
                _HELD[key] = _acquire(self.directory, self.log)
        self._key = key
        return self

    def release(self) -> None:
        """Give this object's hold back; the last hold of the process removes the lock file."""
        key, self._key = self._key, None
        if key is None:
            return
        with _GUARD:
            held = _HELD.get(key)
            if held is None:
                return
            held.count -= 1
            if held.count > 0:
                return
            del _HELD[key]
            _release(held)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _probe(directory: str | os.PathLike[str]) -> tuple[bool, dict[str, Any] | None]:
    """(whether a process holds the lock of ``directory`` now, the lock file's record). Takes
    nothing and writes nothing (the directory may be read-only)."""
    if os.path.realpath(directory) in _HELD:
        return True, _holder_record()
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False, None
    try:
        record = _read_record(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, record
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            return bool(record) and pid_alive(record.get("pid")), record
        return False, record
    finally:
        os.close(fd)  # also drops the shared lock just taken


def current_holder(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The holder record (see :func:`describe_holder`) when a process writes ``directory`` now, else None."""
    held, record = _probe(directory)
    return (record or {}) if held else None


def abandoned(directory: str | os.PathLike[str]) -> bool:
    """Whether no live process on this host holds or recorded the lock of ``directory``: the lock
    is free and its record, if any, names this host and a process that no longer runs."""
    held, record = _probe(directory)
    if held:
        return False
    if not record:
        return True
    return record.get("host") == socket.gethostname() and not pid_alive(record.get("pid"))
