"""A harness for testing distributed code with real processes.

Every distributed test in neural_arch runs through this module: N real Python processes
(or ``mpiexec -n N`` for the MPI backend) rendezvous into a process group, run a picklable
function, and send back their results or their tracebacks. Every wait has a deadline and
every process is reaped, even when a test fails or a rank hangs.

Two entry points:

* :class:`RankPool` keeps its ranks alive and feeds them many functions: start it once per
  test module (a process start costs about a second here) and run hypothesis examples
  through it.
* :func:`run_ranks` starts fresh processes for one function and reports what happened to
  each rank, including ranks that died: the tool for fault tests.

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

from collections.abc import Callable

from neural_arch.distributed.run.env import free_port
from neural_arch.distributed.run.pool import RankFailure, RankPool, RankResult, mpiexec_path

__all__ = ["RankFailure", "RankPool", "RankResult", "free_port", "mpiexec_path", "run_ranks"]

# The pool itself lives in neural_arch.distributed.run.pool (launch() and spawn() use it too);
# this module is the testing face: the same pool plus run_ranks for fault tests.


def run_ranks(fn: Callable, world_size: int, backend: str = "gloo", args: tuple = (), timeout: float = 60.0,
              env: dict[str, str] | None = None, init: bool = True, kwargs: dict | None = None
              ) -> list[RankResult]:
    """Run ``fn(*args)`` once on ``world_size`` fresh ranks; report each rank's outcome.

    Unlike :meth:`RankPool.run` this never raises for a failing rank: fault tests inspect
    the results (a rank that SIGKILLed itself shows ``exc_type == "Died"`` and its exit code).
    """
    pool = RankPool(world_size, backend=backend, timeout=timeout, env=env, init=init)
    try:
        return pool.run_detailed(fn, *args, **(kwargs or {}))
    finally:
        pool.close()
