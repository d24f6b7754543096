"""Name the failed stage on every pipeline rank, not only on its neighbours.

A stage that fails mid-schedule is only *seen* by its neighbours (the ranks it exchanges
activations and gradients with); a rank two hops away just sees its own neighbour stop. So
every rank whose step fails writes one record into the rendezvous store, and every rank then
reads the others' records to find the culprit:

* a stage whose own action raised (its F, B or W, or a bad schedule) records **itself**
  ``(stage, global rank, action, micro-batch, error)`` and then **poisons** the pipeline group
  (the backend's abort path, as any failed operation does), so ranks blocked in a pipeline
  send/receive fail at once instead of after their timeout;
* a stage whose send/receive failed (timeout, dead peer, poisoned group) records the **wait-for
  edge** ``me -> peer`` (the peer it was exchanging with, the action and micro-batch);
* the culprit is found by following the edges from this rank: a rank that recorded itself,
  or the first rank with no record of its own (dead or hung: the end of the chain of waits).
  A rank polls until the chain's end has not moved for :data:`SETTLE_S` seconds (the other
  ranks write within milliseconds of being poisoned), at most :data:`LOOKUP_WAIT_S`.

Keys are per process-group generation, pipeline group and step number (every rank of a
pipeline counts its steps alike), so a long-lived pool of ranks never reads an old record.
Without a store (the mpi backend) each rank names the neighbour it was waiting for.

Example::

    record(group, step, me, {"kind": "self", "stage": 3, "rank": 3, "action": "F2@s3",
                             "microbatch": 2, "error": "RuntimeError: boom"})
    culprit(group, step, me)     # -> (global rank, text) or None
"""

from __future__ import annotations

import json
import logging
import time

_log = logging.getLogger(__name__)
_steps: dict[tuple, int] = {}  # (generation, group ranks) -> steps started on this rank
#: the longest a failed rank waits for the other ranks' records
LOOKUP_WAIT_S = 4.0
#: the chain of waits is taken as complete when its end has not moved for this long
SETTLE_S = 0.75


def _store():
    from neural_arch.distributed.state import STATE

    stores = list(STATE.stores.values())
    return stores[0] if len(stores) == 1 else None


def _generation() -> int:
    from neural_arch.distributed.state import STATE

    return STATE.world.generation if STATE.world is not None else 0


def next_step(group) -> int:
    """Number this rank's step on ``group`` (0, 1, ...); every pipeline rank counts alike.

    Example::

        step = next_step(stage.group)            # 0 on the first schedule.step(), then 1, 2, ...
    """
    key = (_generation(), tuple(group.ranks))
    n = _steps.get(key, 0)
    _steps[key] = n + 1
    return n


def _base(group, step: int) -> str:
    ranks = "-".join(str(r) for r in group.ranks)
    return f"neural_arch/pipeline/pg{_generation()}/{ranks}/step{step}"


def record(group, step: int, global_rank: int, rec: dict) -> bool:
    """Store this rank's record of a failed step (see the module doc); True if stored.

    Example::

        record(group, step, dist.get_rank(), {"kind": "self", "rank": dist.get_rank(), "stage": 1})
    """
    store = _store()
    if store is None:
        return False
    try:
        store.set(f"{_base(group, step)}/rank{global_rank}", json.dumps(rec))
        return True
    except Exception as exc:  # noqa: BLE001 - best effort: the local error is what matters
        _log.debug("could not record the failed pipeline step: %s", exc)
        return False


def _read(store, base: str, rank: int) -> dict | None:
    key = f"{base}/rank{rank}"
    return json.loads(store.get(key).decode()) if store.check([key]) else None


def _follow(store, base: str, start: int) -> tuple[int, str] | None:
    rank, seen, via = start, [], None
    while True:
        rec = _read(store, base, rank)
        if rec is None:  # no record: dead or hung -- the end of the chain of waits
            if via is None:
                return None
            return rank, (f"pipeline stage {via['peer_stage']} (global rank {rank}) stopped answering: "
                          f"stage {via['stage']} (global rank {via['rank']}) waited for its {via['action']} "
                          f"(micro-batch {via['microbatch']}) and got {via['error']}")
        if rec["kind"] == "self":
            return rank, _describe_self(rank, rec)
        seen.append(rank)
        if rec["peer"] in seen:
            cycle = seen[seen.index(rec["peer"]):]
            return rec["peer"], f"pipeline ranks {cycle} wait for each other (a schedule deadlock)"
        via, rank = rec, rec["peer"]


def _describe_self(rank: int, rec: dict) -> str:
    return (f"pipeline stage {rec['stage']} (global rank {rank}) failed in {rec['action']} "
            f"(micro-batch {rec['microbatch']}): {rec['error']}")


def _self_recorded(store, base: str, ranks) -> tuple[int, str] | None:
    for rank in ranks:
        rec = _read(store, base, rank)
        if rec is not None and rec["kind"] == "self":
            return rank, _describe_self(rank, rec)
    return None


def culprit(group, step: int, global_rank: int, wait_s: float | None = None) -> tuple[int, str] | None:
    """``(global rank, description)`` of the stage that made this step fail, or None (no store).

    Example::

        found = culprit(group, step, dist.get_rank())
        if found is not None:
            rank, description = found           # the stage that made this step fail
    """
    store = _store()
    if store is None:
        return None
    base = _base(group, step)
    wait_s = LOOKUP_WAIT_S if wait_s is None else wait_s
    start = time.monotonic()
    last, since = None, start
    try:
        while True:
            # A stage that failed on its own records itself *before* it aborts the group, so when a
            # rank got here through that abort the record is already there: it is the root cause,
            # whatever the chain of waits looks like while the other ranks are still writing theirs.
            own = _self_recorded(store, base, group.ranks)
            if own is not None:
                return own
            found = _follow(store, base, global_rank)
            now = time.monotonic()
            end = _read(store, base, found[0]) if found is not None else None
            if end is not None and end["kind"] == "self":
                return found  # the culprit recorded itself: final
            # (a record that appeared since _follow read "none" is a wait-for edge of a neighbour
            # that was still writing: the chain goes on past it, so look again)
            if found != last:
                last, since = found, now
            elif found is not None and now - since >= SETTLE_S:
                return found
            if now - start >= wait_s:
                return found
            time.sleep(0.05)
    except Exception as exc:  # noqa: BLE001 - a dead store must not hide the pipeline's own error
        _log.debug("could not read the failed pipeline stage: %s", exc)
        return last


def poison(group, why: str) -> None:
    """Fail ``group`` on this rank and tell its other ranks (``Backend.abort``): the group is
    unusable afterwards on every rank, which is right -- a pipeline step that stopped half-way
    left messages in flight.

    Example::

        poison(group, "stage 1 raised in F3")    # every rank's pending pipeline op fails at once
    """
    try:
        group.backend.abort(why)
    except Exception as poison_exc:  # noqa: BLE001 - best effort
        _log.debug("could not poison the pipeline group: %s", poison_exc)


__all__ = ["LOOKUP_WAIT_S", "SETTLE_S", "culprit", "next_step", "poison", "record"]
