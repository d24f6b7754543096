"""Rank functions of the flight recorder's process tests (module level: pickled by reference).

Every scenario runs four all_reduces of one shape and then a barrier on three ranks; the culprit,
rank 1, departs from that at the third all_reduce (sequence number 3):

* ``skip``: it skips that all_reduce (so its barrier meets the others' fourth all_reduce, #4);
* ``broadcast``: it calls broadcast instead; ``shape``: it reduces another shape;
* ``hang``: it sleeps in user code past the others' timeout; a timer sends it SIGUSR1 meanwhile,
  as an operator would (``kill -USR1``); once its dump is written it returns without another
  collective (the tests turn the dump watcher off for this case);
* ``idle``: the same hang with no signal: the first rank to time out asks every rank to dump, and
  the culprit's dump watcher answers;
* ``kill``: it SIGKILLs itself.
"""

from __future__ import annotations

CULPRIT = 1
STEPS = 4
SIGNAL_AT_S = 2.5  # the culprit's SIGUSR1: after the others timed out (the tests' NEURAL_ARCH_TIMEOUT is 2 s)
HANG_MAX_S = 15.0  # the culprit hangs until its dump is written, or this long


def scenario(kind: str, backend: str | None = None, fetch_to: str | None = None) -> str:
    """Run the scenario ``kind`` (module docstring); with ``fetch_to``, rank 0 then copies every
    rank's dump from the rendezvous store into that folder (the run sets no dump folder)."""
    import os
    import signal
    import threading
    import time

    import numpy as np

    import neural_arch.distributed as dist

    if backend is not None:     # MPI: the pool starts the ranks under mpiexec without a group
        dist.init_process_group(backend)
    rank = dist.get_rank()
    x = np.ones(4, np.float32)
    try:
        for i in range(STEPS):
            if rank == CULPRIT and i == 2:
                if kind == "skip":
                    continue
                if kind == "broadcast":
                    dist.broadcast(x, 0)
                    continue
                if kind == "shape":
                    dist.all_reduce(np.ones(5, np.float32))
                    continue
                if kind in ("hang", "idle"):
                    if kind == "hang":
                        threading.Timer(SIGNAL_AT_S, os.kill, (os.getpid(), signal.SIGUSR1)).start()
                    mine = os.path.join(os.environ["NEURAL_ARCH_FLIGHT_RECORDER_DIR"], f"rank{rank}.json")
                    end = time.monotonic() + HANG_MAX_S
                    while not os.path.exists(mine) and time.monotonic() < end:
                        time.sleep(0.05)            # the handler (or the watcher's thread) runs meanwhile
                    return "hung"
                if kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(x)
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - the test reads the dumps, not the error
        if fetch_to is not None and rank == 0:
            _fetch(fetch_to, dist.get_world_size())
        return type(exc).__name__
    return "ok"


def _fetch(folder: str, world: int) -> None:
    import time

    from neural_arch.distributed.flight_recorder import buffer, fetch_from_store
    from neural_arch.distributed.flight_recorder.writer import STORE_PREFIX

    store = buffer.RECORDER.rendezvous_store()
    keys = [f"{STORE_PREFIX}{r}" for r in range(world)]
    end = time.monotonic() + 10
    while not store.check(keys) and time.monotonic() < end:
        time.sleep(0.05)
    fetch_from_store(store, world, folder)
