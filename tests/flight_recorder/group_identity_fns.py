"""Rank functions of ``test_group_identity.py`` (module level: pickled by reference)."""

from __future__ import annotations


def twin_pairs(folder: str) -> dict:
    """Three ranks; ``odd = new_group([1, 2])`` (rank 0 is outside it), then two groups with the same
    members, ``first`` and ``second = new_group([0, 1])``. Ranks 0 and 1 run all_reduce on first,
    second, first; rank 0 then starts a second all_reduce on ``second`` (async) that rank 1 skips.
    Every rank dumps its ring into ``folder`` while rank 0 waits in it; then rank 1 joins it after
    all, so the pool's ranks end clean. Returns this rank's groups' ids (None outside a group)."""
    import numpy as np

    import neural_arch.distributed as dist
    from neural_arch.distributed.flight_recorder import dump
    from neural_arch.distributed.process_group import GroupMember

    rank = dist.get_rank()
    odd = dist.new_group([1, 2])
    first = dist.new_group([0, 1])
    second = dist.new_group([0, 1])
    x = np.ones(3)
    work = None
    if rank in (0, 1):
        dist.all_reduce(x, group=first)       # first #1
        dist.all_reduce(x, group=second)      # second #1
        dist.all_reduce(x, group=first)       # first #2
        if rank == 0:
            work = dist.all_reduce(x, group=second, async_op=True)   # second #2: rank 1 skips it
    dump("test", folder=folder)
    dist.barrier()                            # every rank dumped before rank 1 lets #2 complete
    if rank == 1:
        dist.all_reduce(x, group=second)
    if work is not None:
        work.wait()

    def ids(g):
        if g is GroupMember.NON_GROUP_MEMBER:
            return None
        assert g.backend.group_id == g.group_id      # the backend records the group's id
        return g.group_id
    out = {"world": dist.get_default_group().group_id, "odd": ids(odd), "first": ids(first), "second": ids(second)}
    for g in (odd, first, second):
        if g is not GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    return out


def where_in_twins() -> list | None:
    """Ranks 0 and 1 make two groups with the same members and run a synchronous all_reduce (the
    fused fast path, which reuses one OpInfo) and a barrier (the general path) on each; returns how
    MPI's presence would describe each op (``progress.where``), or None on rank 2."""
    import numpy as np

    import neural_arch.distributed as dist
    from neural_arch.distributed.comm.mpi.progress import where

    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    out = None
    if dist.get_rank() in (0, 1):
        out = []
        for g in groups:
            dist.all_reduce(np.ones(2), group=g)
            fast = g.backend._fast_info
            out.append((g.group_id, where(fast), where(g.backend._new_info("barrier"))))
    for g in groups:
        dist.destroy_process_group(g)
    return out
