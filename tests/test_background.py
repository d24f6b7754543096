"""The background job queue (tests/background.py): a queued job the test reaches first runs in the test, one
the thread has is waited for, a job never queued is built and run, a job past its timeout is killed and says
so, a job that failed in the background runs again in the test (with a warning), and stopping removes every
job's folder; the tests that read a job run last, the busy-waiting ones just before them."""

from __future__ import annotations

import os
import sys
import threading
import types

import pytest
from background import Job, JobQueue, pytest_collection_modifyitems, queue_summary


def _python(name: str, code: str, timeout: float = 30.0) -> Job:
    return Job(name, [sys.executable, "-c", code], timeout=timeout)


def test_queued_running_never_queued_and_timed_out_jobs():
    queue = JobQueue(workers=1)
    gate = _python("gate", "import time; time.sleep(0.5); print('gate done')")
    queue.submit(gate)
    queue.submit(_python("second", "print('second')"))
    # "second" is behind "gate", which the thread is running: the test runs it itself, at once
    second = queue.result("second", lambda: _python("unused", ""))
    assert second.returncode == 0 and second.stdout == "second\n" and not second.ran_in_background
    done = queue.result("gate", lambda: _python("unused", ""))
    assert done.ran_in_background and done.stdout == "gate done\n" and done.returncode == 0
    alone = queue.result("alone", lambda: _python("alone", "import os; print(os.getcwd())"))
    assert alone.returncode == 0 and alone.stdout.strip() == str(alone.workdir) and not alone.ran_in_background
    slow = queue.result("slow", lambda: _python("slow", "import time; time.sleep(30)", timeout=0.5))
    assert slow.timed_out and slow.returncode != 0
    folders = [job.workdir for job in (second, done, alone, slow)]
    assert all(f.is_dir() for f in folders)
    queue.stop()
    assert not any(f.exists() for f in folders)
    assert not [t for t in threading.enumerate() if t.name == "background-jobs"]


def test_a_job_that_fails_in_the_background_runs_again_in_the_test():
    queue = JobQueue()
    # fails only at the background's lower priority (starved of CPU, say), passes at the test's
    queue.submit(_python("niced", f"import os, sys; sys.exit(1 if os.nice(0) > {os.nice(0)} else 0)"))
    queue.join(30)                                # the queue ran it (and it failed there)
    with pytest.warns(UserWarning, match="background job 'niced' exited 1"):
        job = queue.result("niced", lambda: _python("unused", ""))
    assert job.returncode == 0 and not job.ran_in_background
    queue.stop()


def test_latency_bound_tests_run_after_the_rest_and_before_the_tests_that_read_a_job():
    def item(name, marker=None, reads=False):
        module = types.SimpleNamespace(background_jobs=(lambda items: []) if reads else None)
        return types.SimpleNamespace(name=name, module=module,
                                     get_closest_marker=lambda m, _k=marker: object() if m == _k else None)

    items = [item("reads", reads=True), item("spins", "latency_bound"), item("plain"), item("slow", "slow"),
             item("spins-and-reads", "latency_bound", reads=True), item("spins too", "latency_bound")]
    pytest_collection_modifyitems(None, None, items)
    assert [i.name for i in items] == ["plain", "slow", "spins", "spins too", "reads", "spins-and-reads"]


def test_the_summary_says_how_much_job_time_ran_where_and_when_the_queue_drained(tmp_path):
    # (a workdir given: a Job makes a temporary folder of its own otherwise, which the leak check counts)
    a, b, idle = (Job(name, ["true"], workdir=tmp_path) for name in ("a", "b", "never"))
    a.seconds, a.ended_at, a.ran_in_background = 40.0, 150.0, True
    b.seconds, b.ended_at = 5.0, 300.0                       # ran in its test, at normal priority
    line = queue_summary([a, b, idle], queued_at=100.0, now=320.0)
    assert line == ("background queue: 2 jobs, 45 s of job time (1 in the background, 1 in their tests); "
                    "the last ended 200 s after queueing, 20 s before the session's end")
    assert queue_summary([idle], 0.0, 1.0) == "background queue: no job ran"
