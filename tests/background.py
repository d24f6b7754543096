"""Long, self-contained checks run in the background beside the rest of the suite: a pytest plugin loaded
by ``tests/conftest.py``.

Some tests spend most of their time in one subprocess that depends on nothing other tests do: the API
reference's Sphinx build (``tests/docs``), each notebook's headless run (``tests/examples``), the Slurm
scenario, and the examples' launcher runs (DDP, CNN, restart, 3-d and 5-d GPT, the strict fake cuda, the
fault-tolerance replicas under their launchers). A test
module declares such work by defining ``background_jobs(items)``, returning a :class:`Job` for each of its
collected ``items`` that needs one. When collection ends, the session queues every module's jobs and one
background threads (two) run the queue, a job each at a time, at the lowest CPU priority (nice 19): they take
the cycles the other tests leave idle (their ranks waiting on sockets, their fault cases waiting out
timeouts) and yields to every test running in the foreground, MPI's busy-polling ranks included. The
tests that read a job's result run at the end of the session (``pytest_collection_modifyitems``), so the
queue has the whole run to get there; such a test asks for its job's result with :func:`result`: a job already done answers at once, a running
one is waited for, and a job still queued -- or never queued, when the test runs alone -- runs at once
in the test itself, at normal priority, so a test behaves the same whether or not the queue got to its
job first.

A job that failed or timed out in the background runs again in the test, at normal priority, and the
test judges that run: starved of CPU behind a busy foreground, a background job can miss a deadline of
its own (a rank's collective timeout) through no fault of the code it checks. The background failure is
reported as a warning in the run's summary, so a job that only fails there is still seen.

Example (a test module)::

    def background_jobs(items):
        return [Job("docs", [sys.executable, "-m", "sphinx", ...], cwd=REPO, timeout=600)]

    def test_docs_build():
        done = background.result("docs", make_the_same_job)
        assert done.returncode == 0, done.stderr
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from neural_arch.distributed.testing import _drain, _end_job


@dataclass
class Job:
    """One subprocess: its command, folder, environment and timeout; the result fields fill in when it ends.

    ``workdir`` is the job's folder for its files (a fresh one unless given; also ``cwd`` unless that is
    given), removed at the end of the session: the leak check requires the temporary folder empty.
    ``nice`` is the job's CPU priority when the queue runs it (in a test it runs at normal priority);
    ``first`` queues it ahead of the others (the longest job, whose test comes early).
    """

    name: str
    argv: list[str]
    cwd: Path | None = None
    env: dict | None = None
    timeout: float = 300.0
    nice: int = 19
    first: bool = False
    workdir: Path | None = None
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    seconds: float = 0.0
    ended_at: float | None = None        # time.monotonic() when its (last) run ended
    ran_in_background: bool = False
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="job-"))
        if self.cwd is None:
            self.cwd = self.workdir

    def run(self, nice: int = 0) -> None:
        """Run the command to its end or its timeout (then it is killed and ``timed_out`` is set)."""
        self.returncode, self.stdout, self.stderr, self.timed_out = None, "", "", False
        self._done.clear()
        nice = [shutil.which("nice"), "-n", str(nice)] if nice and shutil.which("nice") else []
        start = time.monotonic()
        try:
            # its own session: a launcher's ranks are ended with it (testing's _end_job), never orphaned
            self._proc = subprocess.Popen(nice + self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True)
            try:
                self.stdout, self.stderr = self._proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _end_job(self._proc)
                self.stdout, self.stderr = _drain(self._proc)
                self.timed_out = True
            self.returncode = self._proc.returncode
        except OSError as exc:  # could not start: the test reports it like a failed run
            self.returncode, self.stderr = -1, f"could not start {self.argv[0]}: {exc}"
        finally:
            self.ended_at = time.monotonic()
            self.seconds = self.ended_at - start
            self._done.set()

    def kill(self) -> None:
        """End the job and everything it started (the session's processes and their descendants)."""
        if self._proc is not None and self._proc.poll() is None:
            _end_job(self._proc)


class JobQueue:
    """Jobs by name, run in order by ``workers`` background threads (one job each at a time: a bounded
    extra load; two by default, so the idle cycles of both cores of a small machine are used)."""

    def __init__(self, workers: int = 2):
        self._jobs: dict[str, Job] = {}
        self._waiting: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()
        self._workers = int(workers)
        self._threads: list[threading.Thread] = []
        self._stopping = False

    def submit(self, job: Job, first: bool = False) -> None:
        """Queue ``job`` (at the front with ``first``: a long job whose test comes early)."""
        with self._lock:
            if job.name in self._jobs:
                raise ValueError(f"two background jobs are named {job.name!r}")
            self._jobs[job.name] = job
            (self._waiting.appendleft if first else self._waiting.append)(job.name)
            self._threads = [t for t in self._threads if t.is_alive()]
            start = self._workers - len(self._threads)
            for _ in range(max(0, start)):
                thread = threading.Thread(target=self._work, name="background-jobs", daemon=True)
                self._threads.append(thread)
                thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the worker threads (they end when the queue is empty)."""
        for thread in list(self._threads):
            thread.join(timeout)

    def _next(self) -> Job | None:
        with self._lock:
            if self._stopping or not self._waiting:
                return None
            job = self._jobs[self._waiting.popleft()]
            job.ran_in_background = True    # claimed under the lock: the test now waits instead of running it
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            job.run(nice=job.nice)

    def result(self, name: str, make: Callable[[], Job]) -> Job:
        """The finished job ``name``: waited for if the thread has it, run here if still queued or never queued."""
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                job = self._jobs[name] = make()
            elif name in self._waiting:
                self._waiting.remove(name)
            run_here = not job.ran_in_background and not job._done.is_set()
        if run_here:
            job.run()
        job._done.wait()
        if job.ran_in_background and (job.timed_out or job.returncode != 0):
            what = f"timed out after {job.timeout:.0f} s" if job.timed_out else f"exited {job.returncode}"
            warnings.warn(f"background job {name!r} {what} (stderr tail: {job.stderr[-500:]!r}); running it "
                          "again in the test, which judges that run", stacklevel=2)
            job.ran_in_background = False
            job.run()
        return job

    def stop(self) -> None:
        """Drop what is queued, kill what runs, remove every job's folder."""
        with self._lock:
            self._stopping = True
            self._waiting.clear()
            jobs = list(self._jobs.values())
        for job in jobs:
            job.kill()
        self.join(30)
        for job in jobs:
            if job.workdir is not None:
                shutil.rmtree(job.workdir, ignore_errors=True)
        with self._lock:
            self._jobs.clear()
            self._stopping, self._threads = False, []


QUEUE = JobQueue()
_TIMES: dict = {}     # "queued": when the session queued its jobs; "summary": the line for the run's summary


def queue_summary(jobs, queued_at: float, now: float) -> str:
    """One line on where the background queue's time went (the suite's budget is wall time: a queue that
    drains late holds the run's end, one that drains early left idle cycles for more jobs).

    Example::

        >>> j = Job("docs", ["true"], workdir=Path(".")); j.seconds, j.ended_at, j.ran_in_background = 30.0, 130.0, True
        >>> print(queue_summary([j], queued_at=100.0, now=400.0))
        background queue: 1 jobs, 30 s of job time (1 in the background, 0 in their tests); the last ended 30 s after queueing, 270 s before the session's end
    """
    ran = [j for j in jobs if j.ended_at is not None]
    if not ran:
        return "background queue: no job ran"
    last = max(j.ended_at for j in ran)
    back = sum(1 for j in ran if j.ran_in_background)
    return (f"background queue: {len(ran)} jobs, {sum(j.seconds for j in ran):.0f} s of job time ({back} in the "
            f"background, {len(ran) - back} in their tests); the last ended {last - queued_at:.0f} s after queueing, "
            f"{now - last:.0f} s before the session's end")


def result(name: str, make: Callable[[], Job]) -> Job:
    """The finished background job ``name`` (see the module docstring); ``make`` builds it if never queued."""
    return QUEUE.result(name, make)


def pytest_collection_modifyitems(session, config, items):
    """The tests that read a background job's result run last (in their order): by then the queue has
    had the whole run's idle cycles for their jobs, where in collection order (``tests/docs``,
    ``tests/examples`` come early) a test would wait for its job or run it itself in the foreground.

    Just before them run the tests marked ``latency_bound``: ranks that busy-wait on each other (the
    shared-memory transport's spin, MPI's polling), whose every step waits for a peer to be scheduled.
    Beside the queue's multi-rank jobs they take several times as long (nice 19 does not keep a waiting
    rank's peer on a core); run after the rest of the suite, they find the queue drained."""
    def reads_a_job(item) -> bool:
        module = getattr(item, "module", None)
        return module is not None and callable(getattr(module, "background_jobs", None))

    def busy_waits(item) -> bool:
        return item.get_closest_marker("latency_bound") is not None

    late = [item for item in items if reads_a_job(item)]
    waiting = [item for item in items if busy_waits(item) and not reads_a_job(item)]
    if late or waiting:
        rest = [item for item in items if not busy_waits(item) and not reads_a_job(item)]
        items[:] = rest + waiting + late


def pytest_collection_finish(session):
    by_module: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and callable(getattr(module, "background_jobs", None)):
            by_module.setdefault(module, []).append(item)
    _TIMES["queued"] = time.monotonic()
    for module, items in by_module.items():
        for job in module.background_jobs(items):
            QUEUE.submit(job, first=job.first)


@pytest.hookimpl(tryfirst=True)   # before the leak check looks at processes and the temporary folder
def pytest_sessionfinish(session, exitstatus):
    with QUEUE._lock:
        jobs = list(QUEUE._jobs.values())
    if jobs and "queued" in _TIMES:
        _TIMES["summary"] = queue_summary(jobs, _TIMES["queued"], time.monotonic())
    QUEUE.stop()


def pytest_terminal_summary(terminalreporter):
    if "summary" in _TIMES:
        terminalreporter.write_line(_TIMES.pop("summary"))
