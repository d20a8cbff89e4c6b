import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from budgeted_attention.cli import main
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import set_writes_enabled
from budgeted_attention.runlock import LOCK_NAME, RunDirLock, RunDirLockedError, abandoned, current_holder

# A second process that takes the lock of argv[1], says so, and holds it until killed.
HOLDER = """
import sys, time
from budgeted_attention.runlock import RunDirLock
RunDirLock(sys.argv[1], log=lambda *_: None).acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """(run directory, process holding its lock)."""
    run = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield run, process
    finally:
        process.kill()
        process.wait()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_second_writer_fails_at_once_naming_the_holder_and_a_killed_holders_lock_is_taken_over(holder):
    run, process = holder
    record = json.loads((run / LOCK_NAME).read_text())
    assert record["pid"] == process.pid and record["host"] == socket.gethostname() and record["started"]
    assert current_holder(run)["pid"] == process.pid and not abandoned(run)
    with pytest.raises(RunDirLockedError, match=f"is being written by PID {process.pid} on host {socket.gethostname()}"):
        RunDirLock(run).acquire()
    assert isinstance(RunDirLockedError("x"), ConfigError)  # the CLI's one line and exit code 2

    process.send_signal(signal.SIGKILL)  # no finally: the record stays, the kernel drops the flock
    process.wait()
    assert (run / LOCK_NAME).is_file() and current_holder(run) is None and abandoned(run)
    messages = []
    with RunDirLock(run, log=messages.append):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(messages) == 1 and f"stale lock of '{run}'" in messages[0] and f"PID {process.pid}" in messages[0]
    assert not (run / LOCK_NAME).exists()  # a clean release leaves no lock file


def test_one_process_may_lock_again_and_the_last_release_cleans_up(tmp_path):
    run = tmp_path / "new"
    outer, inner = RunDirLock(run).acquire(), RunDirLock(run).acquire()
    inner.release()
    assert (run / LOCK_NAME).is_file()
    inner.release()  # idempotent: the outer hold stays
    assert (run / LOCK_NAME).is_file()
    outer.release()
    assert not run.exists()  # made by the lock, left empty: removed (a failed start leaves nothing)
    kept = tmp_path / "kept"
    with RunDirLock(kept):
        (kept / "config.yaml").write_text("x")
    assert sorted(p.name for p in kept.iterdir()) == ["config.yaml"]


def test_a_free_lock_of_a_running_process_or_of_another_host_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "started": "t"}))
        with pytest.raises(RunDirLockedError, match=f"PID {sleeper.pid} .* still runs although the lock is free"):
            RunDirLock(run).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    (run / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": "elsewhere", "started": "t"}))
    with pytest.raises(RunDirLockedError, match="host elsewhere.*delete '.*\\.lock'"):
        RunDirLock(run).acquire()
    assert not abandoned(run)


def test_processes_whose_writes_are_disabled_take_no_lock(tmp_path):
    set_writes_enabled(False)  # a non-zero torchrun rank: rank 0 holds the lock
    try:
        lock = RunDirLock(tmp_path / "run").acquire()
        assert not lock.held and not (tmp_path / "run").exists()
    finally:
        set_writes_enabled(True)


def test_cli_second_demo_into_a_locked_run_exits_2_at_once_naming_the_holder(holder, capsys):
    run, process = holder
    code = main(["demo", "--quick", "--out", str(run), "--set", "train.lr=0.01", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("baa: error:") and f"PID {process.pid}" in err[0]
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing of the second config was written
