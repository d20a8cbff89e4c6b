import os
import subprocess
import sys
import time

from budgeted_attention.io import remove_stale_temp_files

# Killed (SIGKILL: no finally runs) inside an atomic write of argv[1]/units/x.json.
KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from budgeted_attention.io import atomic_path
with atomic_path(Path(sys.argv[1]) / "units" / "x.json") as tmp:
    tmp.write_text("half")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_temp_files_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], check=False)
    left = list((tmp_path / "units").glob(".x.json.p*.tmp"))
    assert len(left) == 1 and not (tmp_path / "units" / "x.json").exists()
    live = tmp_path / f".y.json.p{os.getpid()}.abcd_123.tmp"  # this (running) process's
    old_style = tmp_path / ".z.json.abcd_123.tmp"  # older code's name, without a PID
    recent_old_style = tmp_path / ".w.json.abcd_123.tmp"
    other = tmp_path / "notes.tmp"  # not a name atomic_path makes
    for path in (live, old_style, recent_old_style, other):
        path.write_text("")
    hour_ago = time.time() - 3600
    os.utime(old_style, (hour_ago, hour_ago))
    (tmp_path / "link").symlink_to(tmp_path / "units")  # never followed
    messages = []
    removed = remove_stale_temp_files(tmp_path, messages.append)
    assert sorted(removed) == sorted([left[0], old_style])
    assert live.exists() and recent_old_style.exists() and other.exists()
    assert len(messages) == 2 and all("interrupted write" in m for m in messages)


def test_environment_info_records_the_running_source_version():
    """An editable install keeps the metadata of the version it was installed at; runs record the source's."""
    from budgeted_attention import __version__
    from budgeted_attention.io import environment_info

    assert environment_info()["packages"]["budgeted_attention"] == __version__
