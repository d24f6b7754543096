"""Rank functions for test_init_world_checks.py (run in a 2-rank RankPool started with ``init=False``).

Each function uses its own fresh MASTER_PORT, so a store one test leaves behind (or closes, as a
process exit does) never meets the next one, and sets the WORLD_SIZE its rank believes in.
"""

from __future__ import annotations

import contextlib
import os
import time

import neural_arch.distributed as dist
from neural_arch.distributed import groups


def _outcome(fn):
    t0 = time.monotonic()
    try:
        fn()
        return ("ok", "", time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return (type(exc).__name__, str(exc), time.monotonic() - t0)


@contextlib.contextmanager
def _job(port: int, world_size: int):
    """This rank believes in ``world_size`` ranks on ``port``; afterwards the pool's values return."""
    saved = {k: os.environ[k] for k in ("WORLD_SIZE", "MASTER_PORT")}
    os.environ.update(WORLD_SIZE=str(world_size), MASTER_PORT=str(port))
    try:
        yield int(os.environ["RANK"])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        groups._close_stores()  # what this process's exit would do: the next test starts clean
        os.environ.update(saved)


def world_disagreement(port: int, sizes: list):
    """Rank r believes WORLD_SIZE = sizes[r]; every rank reports what init_process_group told it."""
    with _job(port, sizes[int(os.environ["RANK"])]):
        return _outcome(lambda: dist.init_process_group("gloo", timeout=4, rendezvous_timeout=4))


def lost_store_while_waiting(port: int):
    """A world of 3 of which rank 2 never starts. Rank 0 (the store's host) gives up after 1 s and
    exits (its store closes); rank 1 waits up to 6 s, so it still waits when the store goes."""
    with _job(port, 3) as rank:
        out = _outcome(lambda: dist.init_process_group("gloo", rendezvous_timeout=1 if rank == 0 else 6))
        if rank == 0:
            groups._close_stores()  # rank 0 exits
        return out


def clean_exit_race(port: int):
    """Rank 0 inits, destroys and exits (its store closes) at once; rank 1 is slower: it still uses the
    store 1 s after its init (as a rank still finishing its init does) and only then destroys."""
    with _job(port, 2) as rank:
        dist.init_process_group("gloo", rendezvous_timeout=10)
        if rank == 0:
            t0 = time.monotonic()
            dist.destroy_process_group()
            waited = time.monotonic() - t0
            groups._close_stores()  # rank 0 exits
            return ("ok", "", waited)
        store = next(iter(groups._STATE.stores.values()))
        time.sleep(1.0)  # the slow rank under test (rank 0's destroy must outwait it), not synchronisation
        return _outcome(lambda: store.get(f"neural_arch/pg{groups._STATE.generation}//host/0"))
