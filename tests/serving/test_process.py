"""serving.process: pinning every thread of a process, the CPUs the server keeps, freezing the GC."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from budgeted_attention.serving import process

linux_only = pytest.mark.skipif(not process.supported(), reason="CPU pinning needs Linux")


@linux_only
def test_pin_process_pins_every_thread_and_later_threads_inherit():
    # In a child interpreter: pinning the test process itself would slow the rest of the suite.
    code = textwrap.dedent(
        """
        import os, threading
        from budgeted_attention.serving.process import pin_process, thread_ids
        stop = threading.Event()
        early = threading.Thread(target=stop.wait)
        early.start()
        cpu = min(os.sched_getaffinity(0))
        pin_process({cpu})
        late = threading.Thread(target=stop.wait)
        late.start()
        seen = {tid: os.sched_getaffinity(tid) for tid in thread_ids()}
        stop.set()
        assert len(seen) >= 3, seen
        assert all(cpus == {cpu} for cpus in seen.values()), seen
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@linux_only
def test_server_keeps_the_cpus_the_engine_does_not_take(monkeypatch):
    monkeypatch.setattr(process, "current_cpus", lambda: {0, 1, 2, 3})
    assert process.server_cpus([1]) == {0, 2, 3}
    assert process.server_cpus([0, 1, 2, 3]) == {0, 1, 2, 3}  # nothing left: they share


@linux_only
def test_the_engine_process_runs_on_its_cpus(tiny_run):
    from budgeted_attention.serving.config import ServeConfig  # noqa: PLC0415
    from budgeted_attention.serving.remote import RemoteEngine  # noqa: PLC0415

    cpu = min(os.sched_getaffinity(0))
    remote = RemoteEngine(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, warmup_batches=0, calibration_batch_sizes=[1], engine_cpus=[cpu]))
    try:
        assert os.sched_getaffinity(remote.pid) == {cpu}
        assert remote.describe()["engine_cpus"] == [cpu]
        assert remote.run(remote.tokenize(["a match"]), 1.0).shape == (1, remote.n_classes)
    finally:
        remote.close()


def test_freeze_garbage_collector_exempts_the_objects_alive_now():
    code = textwrap.dedent(
        """
        import gc
        from budgeted_attention.serving.process import freeze_garbage_collector
        kept = [[i] for i in range(1000)]
        freeze_garbage_collector()
        assert gc.get_freeze_count() >= 1000, gc.get_freeze_count()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
