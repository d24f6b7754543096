"""Pipelined hierarchical all-reduce: the host's network link works while shared memory does.

The forms of :mod:`.hierarchical` run their three steps one after the other, so the link between
hosts idles during the shared-memory steps and the other way round. Here the flat buffer is cut
into pieces of about ``chunk_bytes`` and the steps of neighbouring pieces overlap, as NCCL's
chunked rings do: while piece c crosses the network (``async_op=True`` on the cross-host group,
so it runs on that group's progress thread), the calling thread runs the shared-memory steps of
pieces c+1 (reduce) and c-1 (broadcast / all-gather, after waiting for that piece's transfer)::

    main thread:    reduce 0 | reduce 1, bcast -- | reduce 2, bcast 0 | reduce 3, bcast 1 | ...
    cross thread:             | all-reduce 0      | all-reduce 1      | all-reduce 2      | ...

Every rank of a host runs the same sequence of host-group collectives (reduce 0, reduce 1, bcast
0, reduce 2, bcast 1, ...), and every rank cuts the same pieces (a pure function of the element
count, the item size and ``chunk_bytes``), so the groups stay in step without a message.

Results: the unpipelined form's, bitwise for integers. For floats each element meets the same
operands; with 2 ranks per host and 2 hosts every step adds two numbers (commutative: the same
bits, whatever the piece boundaries). With more ranks or hosts the shared-memory and ring
algorithms pick who adds first by an element's position inside a message, so pieces can change
the rounding of floats (never the integers): still within reduction-order rounding of flat.

Failures: an error in a piece's transfer is raised by the wait before that piece's broadcast /
all-gather; an error in a shared-memory step is raised where it happens. Either way the failing
backend poisons every group of the process (the transport and every shared-memory segment), so
the peers' waits fail at once, and every transfer still queued is waited for (it fails fast on
the poisoned group) before the first error propagates: no async op outlives the call.

Only gloo groups pipeline (two threads of one process in collectives on two MPI communicators
need ``MPI_THREAD_MULTIPLE``; MPICH and NCCL run host-aware all-reduces of their own).

Example (2 hosts x 2 ranks, the groups of ``host_groups()``; every rank runs it)::

    hg = host_groups()
    x = np.ones(1 << 22, np.float32)                       # 16 MiB: 16 pieces of 1 MiB
    run_leader_pipelined(x, ReduceOp.SUM, hg.intra.backend,
                         hg.inter.backend if hg.is_leader else None, chunk_bytes=1 << 20)
    # x == 4.0 everywhere, as run_leader(x, ...) gives
"""

from __future__ import annotations

import numpy as np

from neural_arch import config
from neural_arch.distributed.comm.work import ReduceOp

__all__ = ["PIPELINE_CHUNK_BYTES", "pieces", "pipelines", "run_leader_pipelined", "run_two_d_pipelined"]

#: the default piece size (``NEURAL_ARCH_HIERARCHICAL_PIPELINE_BYTES``, read at import; 1 MiB); 0 turns
#: pipelining off (the unpipelined forms of :mod:`.hierarchical`). Messages smaller than two pieces
#: stay unpipelined (one piece has nothing to overlap with). Chosen with ``bench_collectives.py
#: --hierarchical --link-gbit 4`` (see docs/benchmarks.md): it pays when the network is the
#: bottleneck; where CPU is (4 ranks on 2 cores over loopback) the extra thread made it slower.
PIPELINE_CHUNK_BYTES = config.get("NEURAL_ARCH_HIERARCHICAL_PIPELINE_BYTES")


def pieces(n: int, itemsize: int, chunk_bytes: int, align: int = 1) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` element ranges of about ``chunk_bytes`` covering ``n`` elements; every
    boundary is a multiple of ``align`` elements and the last piece absorbs the remainder (so no piece
    is smaller than a full one). One piece when ``n`` holds fewer than two.

    >>> pieces(10, 4, 12)                 # 3 elements per piece, the last takes the rest
    [(0, 3), (3, 6), (6, 10)]
    >>> pieces(11, 4, 12, align=2), pieces(5, 4, 12)  # 3 elements rounded down to a multiple of 2
    ([(0, 2), (2, 4), (4, 6), (6, 8), (8, 11)], [(0, 5)])
    """
    per = max(align, (max(1, chunk_bytes // itemsize) // align) * align)
    k = max(1, n // per)
    return [(i * per, (i + 1) * per if i < k - 1 else n) for i in range(k)]


def pipelines(backend, array, chunk_bytes) -> bool:
    """Whether ``array`` goes through the pipelined forms on ``backend``'s host group (pure: the
    same answer on every rank, which holds the same size and dtype).

    Example::

        pipelines(hg.intra.backend, flat, None)    # True on gloo for two pieces of PIPELINE_CHUNK_BYTES or more
    """
    chunk = _chunk(chunk_bytes)
    return chunk > 0 and getattr(backend, "name", None) == "gloo" and array.nbytes >= 2 * chunk


def _chunk(chunk_bytes) -> int:
    return PIPELINE_CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)


def _drain(works) -> None:
    """Wait for every transfer still in flight (after a failure: they fail fast on the poisoned
    group); their own errors are the first one's echoes and are dropped."""
    for work in works:
        if work is not None:
            try:
                work.wait()
            except BaseException:  # noqa: BLE001, S110 - the first error is being raised already
                pass


def run_leader_pipelined(array, op: ReduceOp, intra, inter, chunk_bytes=None) -> None:
    """The leader form (reduce to the host leader, all-reduce among leaders, broadcast) over pieces of
    ``chunk_bytes`` (default :data:`PIPELINE_CHUNK_BYTES`), the leaders' all-reduce of piece c overlapping
    the host's reduce of piece c+1 and broadcast of piece c-1. ``inter`` is None on non-leaders.

    Example::

        if pipelines(intra, flat, chunk_bytes):
            run_leader_pipelined(flat, ReduceOp.SUM, intra, inter, chunk_bytes)
    """
    flat = array.reshape(-1)
    cuts = pieces(flat.size, flat.dtype.itemsize, _chunk(chunk_bytes))
    works = [None] * len(cuts)
    try:
        for c, (a, b) in enumerate(cuts):
            intra.reduce(flat[a:b], root=0, op=op)
            if inter is not None:
                works[c] = inter.allreduce(flat[a:b], op, async_op=True)
            if c:
                _finish_leader(flat, cuts, works, c - 1, intra)
        _finish_leader(flat, cuts, works, len(cuts) - 1, intra)
    except BaseException:
        _drain(works)
        raise


def _finish_leader(flat, cuts, works, c, intra) -> None:
    if works[c] is not None:
        work, works[c] = works[c], None
        work.wait()
    a, b = cuts[c]
    intra.broadcast(flat[a:b], root=0)


def run_two_d_pipelined(array, op: ReduceOp, intra, cross, chunk_bytes=None) -> None:
    """The 2-D form (reduce-scatter in the host, all-reduce of my slice across hosts, all-gather) over
    pieces of ``chunk_bytes`` (default :data:`PIPELINE_CHUNK_BYTES`): each piece is its own 2-D
    all-reduce, the cross-host all-reduce of piece c overlapping the host's reduce-scatter of piece c+1
    and all-gather of piece c-1. Full pieces hold a multiple of ``intra.size`` elements (no padding);
    the last, which absorbs the remainder, is padded in scratch as :func:`.hierarchical.run_two_d` does.

    Example::

        if pipelines(intra, flat, chunk_bytes):
            run_two_d_pipelined(flat, ReduceOp.SUM, intra, cross, chunk_bytes)
    """
    flat = array.reshape(-1)
    local = intra.size
    cuts = pieces(flat.size, flat.dtype.itemsize, _chunk(chunk_bytes), align=local)
    xp = np if type(flat) is np.ndarray else _xp(flat)
    # one slice buffer per piece: piece c's slice is in flight while c+1's is being reduced
    offsets = [0]
    for a, b in cuts:
        offsets.append(offsets[-1] + -(-(b - a) // local))
    parts = xp.empty(offsets[-1], dtype=flat.dtype)
    tables = [None] * len(cuts)   # (the padded source/table of a piece that needs one)
    works = [None] * len(cuts)
    try:
        for c, (a, b) in enumerate(cuts):
            part = parts[offsets[c]:offsets[c + 1]]
            per = part.size
            if per * local == b - a:
                source = flat[a:b]
            else:
                source = xp.zeros(per * local, dtype=flat.dtype)   # padding: its result is dropped
                source[:b - a] = flat[a:b]
                tables[c] = source          # reused as the all-gather's table (the input was read)
            intra.reduce_scatter(part, source, op)
            works[c] = cross.allreduce(part, op, async_op=True)
            if c:
                _finish_two_d(flat, cuts, works, tables, parts, offsets, c - 1, intra, local)
        _finish_two_d(flat, cuts, works, tables, parts, offsets, len(cuts) - 1, intra, local)
    except BaseException:
        _drain(works)
        raise


def _finish_two_d(flat, cuts, works, tables, parts, offsets, c, intra, local) -> None:
    work, works[c] = works[c], None
    work.wait()
    a, b = cuts[c]
    part = parts[offsets[c]:offsets[c + 1]]
    table = tables[c] if tables[c] is not None else flat[a:b]
    intra.allgather(table.reshape(local, part.size), part)
    if tables[c] is not None:
        flat[a:b] = table[:b - a]


def _xp(array):
    from neural_arch.backend import get_array_module as xp

    return xp(array)
