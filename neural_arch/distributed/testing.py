"""A harness for testing distributed code with real processes.

Every distributed test in neural_arch runs through this module: N real Python processes
(or ``mpiexec -n N`` for the MPI backend) rendezvous into a process group, run a picklable
function, and send back their results or their tracebacks. Every wait has a deadline and
every process is reaped, even when a test fails or a rank hangs.

Three entry points:

* :class:`RankPool` keeps its ranks alive and feeds them many functions: start it once per
  test module (a process start costs about a second here) and run hypothesis examples
  through it.
* :func:`run_ranks` starts fresh processes for one function and reports what happened to
  each rank, including ranks that died: the tool for fault tests.
* :func:`run_mpiexec` runs a whole script under a real ``mpiexec -n N`` in a clean environment
  and kills the whole job (mpiexec, hydra proxy, ranks) on a timeout: the tool for tests of
  scripts and examples as users start them.

Example::

    def total(x):                     # module level: it is pickled by reference
        import neural_arch.distributed as dist
        import numpy as np
        a = np.full(3, float(dist.get_rank() + x))
        dist.all_reduce(a)
        return a.tolist()

    with RankPool(world_size=2) as pool:
        assert pool.run(total, 1) == [[3.0] * 3, [3.0] * 3]

The function runs with ``NEURAL_ARCH_*`` environment variables set by the pool; for the gloo
backend pass ``env={"NEURAL_ARCH_GLOO_TRANSPORT": "tcp"}`` to force a transport.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from neural_arch.distributed.launch_env import MPI_ENV_PREFIXES
from neural_arch.distributed.run.child_env import free_port, set_python_path
from neural_arch.distributed.run.pool import RankFailure, RankPool, RankResult, mpiexec_path

__all__ = ["LAUNCHER_VARS", "MPI_MISSING", "MpiexecResult", "MpiexecTimeout", "RankFailure", "RankPool",
           "RankResult", "free_port", "mpiexec_path", "run_mpiexec", "run_ranks", "script_env"]

# The pool itself lives in neural_arch.distributed.run.pool (launch() and spawn() use it too);
# this module is the testing face: the same pool plus run_ranks for fault tests.


def run_ranks(fn: Callable, world_size: int, backend: str = "gloo", args: tuple = (), timeout: float = 60.0,
              env: dict[str, str] | None = None, init: bool = True, kwargs: dict | None = None
              ) -> list[RankResult]:
    """Run ``fn(*args)`` once on ``world_size`` fresh ranks; report each rank's outcome.

    Unlike :meth:`RankPool.run` this never raises for a failing rank: fault tests inspect
    the results (a rank that SIGKILLed itself shows ``exc_type == "Died"`` and its exit code).

    Example::

        def fn():
            return dist.get_rank()

        results = run_ranks(fn, world_size=3)
        assert [r.value for r in results] == [0, 1, 2]
    """
    pool = RankPool(world_size, backend=backend, timeout=timeout, env=env, init=init)
    try:
        return pool.run_detailed(fn, *args, **(kwargs or {}))
    finally:
        pool.close()


# --------------------------------------------------------------------------- scripts under mpiexec
# Why tests/conftest.py skips tests marked ``mpi`` (and what run_mpiexec raises without it).
MPI_MISSING = "mpi4py/mpiexec not installed: pip install 'neural_arch[mpi]'"

# Variables by which a launcher, mpiexec or SLURM describe a job, plus the per-job NEURAL_ARCH
# settings a test must set explicitly: a child script must not inherit them from whatever started
# pytest (a shell with RANK=3, a pytest run inside a pool rank or an srun step). Variables starting
# with an MPI identity prefix (PMI_, PMIX_, OMPI_COMM_WORLD_, ...: launch_env's list) go too.
LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
    "NEURAL_ARCH_BACKEND", "NEURAL_ARCH_AUTH_TOKEN", "NEURAL_ARCH_TIMEOUT", "NEURAL_ARCH_RENDEZVOUS_TIMEOUT",
    "NEURAL_ARCH_DISTRIBUTED_DEBUG", "NEURAL_ARCH_READY_DIR", "NEURAL_ARCH_PARENT_PID", "NEURAL_ARCH_RESTART_COUNT",
    "NEURAL_ARCH_POOL_ADDR", "NEURAL_ARCH_POOL_KEY", "NEURAL_ARCH_POOL_INIT", "NEURAL_ARCH_POOL_LAUNCHER",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID",
    "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid",
)
_BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL when a job outlives its timeout


def script_env(overrides: Mapping[str, str | None] | None = None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a script a test starts (under mpiexec, the launcher or plain python).

    Starts from ``base`` (default ``os.environ``) without :data:`LAUNCHER_VARS` and MPI identity
    variables; ``PYTHONPATH`` = this package's folder, this process's ``sys.path`` folders (so the
    script imports the same code, test helper modules included), then the inherited entries; one
    BLAS thread per process unless set (ranks share the cores). ``overrides`` are applied last; a
    value of None removes the variable.

    >>> env = script_env({"MASTER_PORT": "1234", "HOME": None}, base={"RANK": "3", "HOME": "/root"})
    >>> "RANK" in env, env["MASTER_PORT"], "HOME" in env, env["OMP_NUM_THREADS"]
    (False, '1234', False, '1')
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in LAUNCHER_VARS and not k.startswith(MPI_ENV_PREFIXES)}
    set_python_path(env, [p for p in sys.path if p and os.path.isdir(p)])
    for var in _BLAS_THREADS:
        env.setdefault(var, "1")
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


class MpiexecResult(subprocess.CompletedProcess):
    """A finished ``mpiexec`` job: ``returncode``, ``stdout``, ``stderr`` (text), ``elapsed`` seconds,
    and ``output`` = stdout + stderr (what an assertion message wants).

    Example::

        result = run_mpiexec("train.py", n=2, args=["--steps", "3"])
        assert result.returncode == 0, result.output
    """

    def __init__(self, args, returncode: int, stdout: str, stderr: str, elapsed: float):
        super().__init__(args, returncode, stdout, stderr)
        self.elapsed = elapsed

    @property
    def output(self) -> str:
        return (self.stdout or "") + (self.stderr or "")


class MpiexecTimeout(subprocess.TimeoutExpired):
    """An ``mpiexec`` job outlived its timeout; every process of it has been killed.

    Carries ``output``/``stdout`` and ``stderr`` (what the ranks printed until then) and ``elapsed``;
    its message ends with the tail of that output, so a failing test shows where the ranks were.

    Example::

        try:
            run_mpiexec("hangs.py", n=2, timeout=10)
        except MpiexecTimeout as exc:
            print(exc.output)                    # what the ranks printed before they were killed
    """

    def __init__(self, cmd, timeout: float, stdout: str, stderr: str, elapsed: float):
        super().__init__(cmd, timeout, output=stdout, stderr=stderr)
        self.elapsed = elapsed

    def __str__(self) -> str:
        tail = ((self.stdout or "") + (self.stderr or ""))[-3000:]
        return (f"mpiexec job did not finish within {self.timeout:g} s (killed after {self.elapsed:.1f} s): "
                f"{' '.join(map(str, self.cmd))}\n--- output so far ---\n{tail}")


def run_mpiexec(script: str | os.PathLike | Sequence[str], n: int = 2, *, args: Sequence = (),
                env: Mapping[str, str | None] | None = None, timeout: float = 60.0,
                cwd: str | os.PathLike | None = None, mpiexec_args: Sequence[str] = ()) -> MpiexecResult:
    """Run ``mpiexec -n n python <script> <args>`` the way a user would; reap the whole job.

    Args:
        script: a path to a ``.py`` file, or the argv after ``python`` (``["-c", code]``,
            ``["-m", "module"]``).
        n: number of ranks.
        args: command-line arguments for the script (converted with ``str``).
        env: overrides of :func:`script_env` (the cleaned environment); None values remove.
        timeout: seconds the whole job may take. Past it, the job (mpiexec, its hydra proxy
            and every rank, each of which leads its own session) gets SIGTERM, then SIGKILL
            after 1 s, and :class:`MpiexecTimeout` (a ``subprocess.TimeoutExpired``) is raised
            with the output so far. The same teardown runs if the wait is interrupted (e.g. by
            pytest-timeout), so no test leaves ranks behind.
        cwd: working folder of the ranks (default: this process's).
        mpiexec_args: extra options for mpiexec itself, before ``-n``.

    Returns an :class:`MpiexecResult` (a ``CompletedProcess`` with ``elapsed``); a non-zero exit
    is returned, not raised: tests assert on it. stdin is ``/dev/null``. Needs mpi4py and mpiexec
    (mark the test ``@pytest.mark.mpi`` to skip it where they are missing); else RuntimeError.

    Example::

        done = run_mpiexec(["-c", "from mpi4py import MPI; print('size', MPI.COMM_WORLD.Get_size())"], n=2)
        assert done.returncode == 0, done.output
        assert done.stdout.count("size 2") == 2 and done.elapsed < 30
    """
    mpiexec = mpiexec_path()
    if mpiexec is None:
        raise RuntimeError(f"run_mpiexec: {MPI_MISSING} (mark the test @pytest.mark.mpi to skip it)")
    argv = [os.fspath(script)] if isinstance(script, (str, os.PathLike)) else [str(a) for a in script]
    cmd = [mpiexec, *mpiexec_args, "-n", str(n), sys.executable, *argv, *(str(a) for a in args)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=script_env(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_job(proc)
        stdout, stderr = _drain(proc)
        raise MpiexecTimeout(cmd, timeout, stdout, stderr, time.monotonic() - start) from None
    except BaseException:  # interrupted (pytest-timeout, Ctrl-C): still take the job down
        _end_job(proc)
        _drain(proc)
        raise
    return MpiexecResult(cmd, proc.returncode, stdout, stderr, time.monotonic() - start)


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """What the job printed, once it is dead (communicate keeps what it read before a timeout)."""
    try:
        return proc.communicate(timeout=5.0)
    except (subprocess.TimeoutExpired, ValueError):  # a pipe still held open by an escaped process
        return "", ""


def _running(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _end_job(proc: subprocess.Popen, grace: float = _KILL_GRACE) -> None:
    """SIGTERM mpiexec's process group and every descendant, SIGKILL what is left after ``grace``.

    Hydra's proxy and each rank call setsid(): killing mpiexec's process group alone would leave
    them running, so the descendants are found by parent links (psutil) before anything dies."""
    import psutil

    def tree() -> list:
        try:
            return psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def signal_all(sig: int, procs: list) -> None:
        try:
            os.killpg(proc.pid, sig)  # mpiexec leads its own session (start_new_session=True)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    children = tree()
    signal_all(signal.SIGTERM, children)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    # Ask again: a child started during the grace is not in the first list.
    _, alive = psutil.wait_procs(children + [c for c in tree() if c not in children], timeout=0.5)
    signal_all(signal.SIGKILL, alive)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_running(p) for p in alive):
        time.sleep(0.02)  # a SIGKILLed zombie is dead: its new parent reaps it when it likes
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass
